//! Request ids: taken from a well-formed incoming `x-request-id`, otherwise generated,
//! echoed on the response, attached to the tracing span and to error bodies.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub const HEADER: &str = "x-request-id";

/// The id of the request being served, available to handlers as an extension.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

tokio::task_local! {
    static CURRENT: String;
}

/// The id of the request this task is serving, if any.
pub fn current() -> Option<String> {
    CURRENT.try_with(Clone::clone).ok()
}

pub async fn middleware(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|value| is_acceptable(value))
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    request.extensions_mut().insert(RequestId(id.clone()));
    let header_value = HeaderValue::from_str(&id).ok();
    let span = tracing::info_span!(
        "http_request",
        http.method = %request.method(),
        http.path = %request.uri().path(),
        request_id = %id,
    );
    let mut response = CURRENT.scope(id, next.run(request)).instrument(span).await;
    if let Some(value) = header_value {
        response.headers_mut().insert(HEADER, value);
    }
    response
}

/// Client-supplied ids end up in logs and the audit log, so only short, plain ones are kept.
fn is_acceptable(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 128
        && value
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b':'))
}
