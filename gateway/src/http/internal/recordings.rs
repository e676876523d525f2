//! Terminal recordings from the workers: chunks as sessions go, and their ends.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use sandbase_api::internal::RecordingEnd;
use uuid::Uuid;

use crate::error::ApiResult;
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::node_token::WorkerIdentity;
use crate::sandboxes::recordings;
use crate::state::AppState;

pub async fn chunk(
    State(state): State<AppState>,
    worker: WorkerIdentity,
    ApiPath((id, chunk)): ApiPath<(Uuid, u32)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    recordings::put_chunk(&state, &worker.0, id, chunk, body).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn end(
    State(state): State<AppState>,
    worker: WorkerIdentity,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(end): ApiJson<RecordingEnd>,
) -> ApiResult<StatusCode> {
    recordings::end(&state, &worker.0, id, end).await?;
    Ok(StatusCode::NO_CONTENT)
}
