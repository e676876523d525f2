//! Recordings from the workers: terminal sessions' chunks as they go and their ends, and
//! commands' recordings whole.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use sandbase_api::internal::{CommandRecording, RECORDING_HEADER, RecordingEnd};
use uuid::Uuid;

use crate::error::{ApiError, ApiResult};
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

/// A command's recording, whole (what it is in the `x-sandbase-recording` header).
pub async fn whole(
    State(state): State<AppState>,
    worker: WorkerIdentity,
    ApiPath(id): ApiPath<Uuid>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let meta: CommandRecording = headers
        .get(RECORDING_HEADER)
        .and_then(|value| serde_json::from_slice(value.as_bytes()).ok())
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!("the {RECORDING_HEADER} header is missing or bad"))
        })?;
    recordings::put_whole(&state, &worker.0, id, &meta, body).await?;
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
