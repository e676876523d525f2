//! Errors in each family's own shape, so the official SDKs raise their usual exception
//! classes: OpenAI's `{"error":{"message","type","code","param"}}`, Anthropic's
//! `{"type":"error","error":{"type","message"}}` (with SandBase's `code` beside).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::ApiError;
use crate::store::Family;

pub struct StoreError {
    pub family: Family,
    pub error: ApiError,
}

impl StoreError {
    pub fn new(family: Family, error: impl Into<ApiError>) -> StoreError {
        StoreError {
            family,
            error: error.into(),
        }
    }
}

/// Anthropic's error type for a status (one table, shared with the translation of OpenAI
/// errors).
fn anthropic_type(status: StatusCode) -> &'static str {
    crate::store::translate::messages_to_chat::error_type(status.as_u16())
}

/// OpenAI's error type for a status.
fn openai_type(status: StatusCode, code: &str) -> &'static str {
    match (status.as_u16(), code) {
        (402, _) => "insufficient_quota",
        (401, _) => "authentication_error",
        (403, _) => "permission_error",
        (429, _) => "rate_limit_error",
        (status, _) if status >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

impl IntoResponse for StoreError {
    fn into_response(self) -> Response {
        let error = self.error;
        if let ApiError::Database(cause) = &error {
            tracing::error!(error = %cause, "database error");
        }
        if let ApiError::Internal(cause) = &error {
            tracing::error!(error = format!("{cause:#}"), "internal error");
        }
        let status = error.status_code();
        let code = error.code();
        let message = error.to_string();
        let body = match self.family {
            Family::Openai => json!({ "error": {
                "message": message,
                "type": openai_type(status, code),
                "code": code,
                "param": null,
            }}),
            Family::Anthropic => json!({
                "type": "error",
                "error": { "type": anthropic_type(status), "message": message, "code": code },
            }),
        };
        let mut response = (status, Json(body)).into_response();
        crate::http::error::set_retry_after(&mut response, &error);
        response
    }
}
