//! Worker registration and heartbeats.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandbase_api::internal::{Heartbeat, HeartbeatReply, RegisterWorker};

use crate::error::ApiResult;
use crate::http::extract::ApiJson;
use crate::http::node_token::WorkerIdentity;
use crate::sandboxes::reconcile;
use crate::state::AppState;

/// A worker (re)starting: it hosts nothing, so whatever it hosted before is lost.
pub async fn register(
    State(state): State<AppState>,
    worker: WorkerIdentity,
    ApiJson(body): ApiJson<RegisterWorker>,
) -> ApiResult<StatusCode> {
    worker.speaks_for(&body.id)?;
    reconcile::register(&state, body).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A worker's periodic report; the answer lists sandboxes it should remove.
pub async fn heartbeat(
    State(state): State<AppState>,
    worker: WorkerIdentity,
    ApiJson(body): ApiJson<Heartbeat>,
) -> ApiResult<Json<HeartbeatReply>> {
    worker.speaks_for(&body.id)?;
    Ok(Json(reconcile::heartbeat(&state, body).await?))
}
