//! What the worker's handlers share: their state and how errors are answered (the public
//! error body, so the gateway can pass them on).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use sandbase_agent::protocol::AgentError;
use sandbase_api::sandboxes::ExecEvent;
use sandbase_api::{ErrorBody, ErrorDetail};

use crate::agent_client::Refused;
use crate::node::{Node, NodeError};

/// Most output a synchronous command returns per stream; the rest is dropped (`truncated`).
pub(super) const SYNC_OUTPUT_LIMIT: usize = 8 * 1024 * 1024;

#[derive(Clone)]
pub(super) struct ApiState {
    pub(super) node: Arc<Node>,
    pub(super) token: Arc<str>,
}

pub(super) fn error(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(ErrorBody {
            error: ErrorDetail {
                code: code.to_owned(),
                message,
                request_id: None,
            },
        }),
    )
        .into_response()
}

impl IntoResponse for NodeError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            NodeError::SandboxNotFound => (StatusCode::NOT_FOUND, "sandbox_not_found"),
            NodeError::ProcessNotFound => (StatusCode::NOT_FOUND, "process_not_found"),
            NodeError::NoPython => (StatusCode::CONFLICT, "python_not_available"),
            NodeError::ContextNotFound => (StatusCode::NOT_FOUND, "context_not_found"),
            NodeError::TooManyContexts(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_contexts"),
            NodeError::ExecNotFound => (StatusCode::NOT_FOUND, "exec_not_found"),
            NodeError::ExecIdInUse(_) => (StatusCode::CONFLICT, "exec_id_in_use"),
            NodeError::ProcessExited(_) => (StatusCode::CONFLICT, "process_exited"),
            NodeError::StdinClosed => (StatusCode::CONFLICT, "stdin_closed"),
            NodeError::SessionUser(_) => (StatusCode::CONFLICT, "session_user_mismatch"),
            NodeError::TooManySessions(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_sessions"),
            NodeError::TerminalNotFound => (StatusCode::NOT_FOUND, "terminal_not_found"),
            NodeError::AtCapacity => (StatusCode::SERVICE_UNAVAILABLE, "at_capacity"),
            NodeError::TooManyProcesses(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_processes"),
            NodeError::TooManyTerminals(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_terminals"),
            NodeError::TemplateNotFound(_) => (StatusCode::NOT_FOUND, "template_not_found"),
            NodeError::Exists => (StatusCode::CONFLICT, "sandbox_exists"),
            NodeError::Paused => (StatusCode::CONFLICT, "sandbox_paused"),
            NodeError::TemplateExists(_) => (StatusCode::CONFLICT, "template_exists"),
            NodeError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            NodeError::PortClosed(_) => (StatusCode::BAD_GATEWAY, "port_closed"),
            NodeError::Refused(Refused(refusal)) => refusal_status(refusal),
            NodeError::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "internal API call failed");
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error on the worker".to_owned(),
                );
            }
        };
        error(status, code, self.to_string())
    }
}

/// The status and code of an agent's refusal of a file operation.
pub(super) fn refusal_status(refusal: &AgentError) -> (StatusCode, &'static str) {
    match refusal.kind.as_str() {
        "not_found" => (StatusCode::NOT_FOUND, "path_not_found"),
        "permission_denied" => (StatusCode::FORBIDDEN, "permission_denied"),
        "already_exists" => (StatusCode::CONFLICT, "already_exists"),
        "not_a_directory" => (StatusCode::CONFLICT, "not_a_directory"),
        "is_a_directory" => (StatusCode::CONFLICT, "is_a_directory"),
        "not_empty" => (StatusCode::CONFLICT, "directory_not_empty"),
        "no_space" => (StatusCode::INSUFFICIENT_STORAGE, "disk_full"),
        "invalid" => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
        "spawn_failed" => (StatusCode::UNPROCESSABLE_ENTITY, "spawn_failed"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "sandbox_io_error"),
    }
}

pub(super) fn ndjson_line(event: &ExecEvent) -> String {
    let mut line = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
    line.push('\n');
    line
}

pub(super) fn ndjson_response(body: Body) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}
