//! How an [`ApiError`] is answered: its status, `{"error":{"code","message","request_id"}}`,
//! `Retry-After` on 429 and `busy` and `WWW-Authenticate` on 401. Internal causes are logged here and
//! never sent.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sandbase_api::{ErrorBody, ErrorDetail};

use crate::error::ApiError;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Database(error) => {
                tracing::error!(error = %error, "database error");
            }
            ApiError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "internal error");
            }
            _ => {}
        }
        let status = self.status_code();
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code().to_owned(),
                message: self.to_string(),
                request_id: super::request_id::current(),
            },
        };
        let mut response = (status, Json(body)).into_response();
        set_retry_after(&mut response, &self);
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sandbase\""),
            );
        }
        response
    }
}

/// `Retry-After` on a response to an error that has one: rate limits, and `busy` (a second).
pub fn set_retry_after(response: &mut Response, error: &ApiError) {
    let retry_after = match error {
        ApiError::RateLimited { retry_after_secs } => Some(*retry_after_secs),
        ApiError::Busy => Some(1),
        _ => None,
    };
    if let Some(seconds) = retry_after
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
}
