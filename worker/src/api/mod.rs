//! The worker's internal HTTP API, called by the gateway with the node token. Errors use the
//! public error body, so the gateway can pass them on.

mod code;
mod egress;
mod exec;
mod execs;
mod files;
mod ports;
mod support;
mod templates;
mod terminal;

use support::{ApiState, error};

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use sandbase_api::internal::{CreateSandbox, NODE_TOKEN_HEADER, paths};
use uuid::Uuid;

use crate::node::{Node, NodeError};

/// The internal API of `node`, accepting only callers that present `token`.
pub fn router(node: Arc<Node>, token: &str) -> Router {
    let state = ApiState {
        node,
        token: Arc::from(token),
    };
    Router::new()
        .route(paths::HEALTH, get(health))
        .route(paths::SANDBOXES, post(create).get(list))
        .route(&paths::sandbox("{id}"), axum::routing::delete(destroy))
        .route(&paths::sandbox_part("{id}", "exec"), post(exec::exec))
        .route(
            &paths::sandbox_part("{id}", "pty"),
            post(terminal::open).get(terminal::list),
        )
        .route(
            &paths::terminal("{id}", "{session}", ""),
            get(terminal::get).delete(terminal::close),
        )
        .route(
            &paths::terminal("{id}", "{session}", "output"),
            get(terminal::output),
        )
        .route(
            &paths::terminal("{id}", "{session}", "input"),
            post(terminal::input),
        )
        .route(
            &paths::terminal("{id}", "{session}", "resize"),
            post(terminal::resize),
        )
        .route(&paths::port("{id}", "{port}"), get(ports::connect))
        .route(&paths::sandbox_part("{id}", "pause"), post(pause))
        .route(&paths::sandbox_part("{id}", "resume"), post(resume))
        .route(
            &paths::sandbox_part("{id}", "processes"),
            get(exec::processes),
        )
        .route(
            &paths::sandbox_part("{id}", "egress-policy"),
            axum::routing::put(egress::set_egress_policy),
        )
        .route(
            &paths::sandbox_part("{id}", "egress"),
            get(egress::egress_flows),
        )
        .route(&paths::process("{id}", "{pid}"), get(exec::process))
        .route(&paths::exec("{id}", "{exec_id}", ""), get(execs::get))
        .route(&paths::code("{id}", ""), post(code::run))
        .route(
            &paths::code("{id}", "contexts"),
            post(code::create_context).get(code::list_contexts),
        )
        .route(
            &paths::code("{id}", "contexts/{context}"),
            axum::routing::delete(code::delete_context),
        )
        .route(
            &paths::code("{id}", "contexts/{context}/interrupt"),
            post(code::interrupt),
        )
        .route(
            &paths::exec("{id}", "{exec_id}", "cancel"),
            post(execs::cancel),
        )
        .route(
            &paths::process_part("{id}", "{pid}", "stdin"),
            post(exec::process_stdin),
        )
        .route(
            &paths::process_part("{id}", "{pid}", "signal"),
            post(exec::process_signal),
        )
        .route(
            &paths::sandbox_part("{id}", "files"),
            get(files::read_path)
                .put(files::write_file)
                .delete(files::remove_path),
        )
        .route(
            &paths::sandbox_part("{id}", "archive"),
            get(files::archive_out).put(files::archive_in),
        )
        .route(
            &paths::template("{name}"),
            axum::routing::put(templates::import_template).delete(templates::remove_template),
        )
        .route(
            &paths::template_pull("{name}"),
            post(templates::pull_template),
        )
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

async fn authenticate(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    use subtle::ConstantTimeEq;
    let presented = request
        .headers()
        .get(NODE_TOKEN_HEADER)
        .map(|value| value.as_bytes())
        .unwrap_or_default();
    if bool::from(presented.ct_eq(state.token.as_bytes())) {
        next.run(request).await
    } else {
        error(
            StatusCode::UNAUTHORIZED,
            "invalid_node_token",
            "missing or wrong node token".to_owned(),
        )
    }
}

async fn health(State(state): State<ApiState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "hosted": state.node.ids().len(),
        "capacity": state.node.capacity(),
    }))
}

/// Runs `work` to its end even when the caller goes away: a connection closed mid-call
/// drops the handler's future, and a create stopped half way (a warm pool's container
/// claimed, the sandbox not yet hosted) would leave a container nobody lists — not even the
/// heartbeats through which the gateway removes what it does not know.
async fn to_the_end<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, NodeError>> + Send + 'static,
) -> Result<T, NodeError> {
    tokio::spawn(work)
        .await
        .map_err(|error| NodeError::Internal(anyhow::anyhow!("a worker task failed: {error}")))?
}

async fn create(
    State(state): State<ApiState>,
    Json(request): Json<CreateSandbox>,
) -> Result<StatusCode, NodeError> {
    let node = Arc::clone(&state.node);
    to_the_end(async move { node.create(request).await }).await?;
    Ok(StatusCode::CREATED)
}

async fn list(State(state): State<ApiState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "sandboxes": state.node.ids() }))
}

async fn destroy(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, NodeError> {
    let node = Arc::clone(&state.node);
    to_the_end(async move { Ok(node.destroy(id).await?) }).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, NodeError> {
    state.node.pause(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn resume(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, NodeError> {
    state.node.resume(id).await?;
    Ok(StatusCode::NO_CONTENT)
}
