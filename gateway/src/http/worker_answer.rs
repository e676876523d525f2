//! A worker's answer to a data-plane call, passed on to the caller as it is.

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::workers::client::WorkerAnswer;

/// A worker's answer passed on as it is: status, content type, file size and a streamed body.
pub fn worker_answer(answer: WorkerAnswer) -> Response {
    let status = answer.status();
    let passed_on: Vec<(HeaderName, HeaderValue)> = WorkerAnswer::PASSED_ON_HEADERS
        .iter()
        .filter_map(|name| {
            let value = HeaderValue::from_bytes(answer.header(name)?).ok()?;
            Some((HeaderName::from_static(name), value))
        })
        .collect();
    let mut response = Body::from_stream(answer.into_response().bytes_stream()).into_response();
    *response.status_mut() = status;
    for (name, value) in passed_on {
        response.headers_mut().insert(name, value);
    }
    response
}
