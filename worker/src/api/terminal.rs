//! Terminal sessions: open, list, input, resize, close, and output from an offset (the
//! agent's frames passed through: `Data` output, JSON `pty_lag` / `exit`, `End`).

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use sandbase_api::terminals::{OpenTerminalRequest, ResizeRequest, Terminal, TerminalList};
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use uuid::Uuid;

use crate::node::NodeError;

use super::support::ApiState;

pub(super) async fn open(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Json(request): Json<OpenTerminalRequest>,
) -> Result<(StatusCode, Json<Terminal>), NodeError> {
    let hosted = state.node.active(id).await?;
    let terminal = hosted
        .open_terminal(&request, state.node.recording_sink())
        .await?;
    Ok((StatusCode::CREATED, Json(terminal.describe())))
}

pub(super) async fn list(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
) -> Result<Json<TerminalList>, NodeError> {
    let hosted = state.node.get(id)?;
    let mut terminals: Vec<Terminal> = hosted.terminals().iter().map(|t| t.describe()).collect();
    terminals.sort_by_key(|terminal| terminal.session_id);
    Ok(Json(TerminalList { terminals }))
}

pub(super) async fn get(
    State(state): State<ApiState>,
    Path((id, session)): Path<(Uuid, u32)>,
) -> Result<Json<Terminal>, NodeError> {
    Ok(Json(state.node.get(id)?.terminal(session)?.describe()))
}

pub(super) async fn close(
    State(state): State<ApiState>,
    Path((id, session)): Path<(Uuid, u32)>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.active(id).await?;
    hosted.close_terminal(session).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn input(
    State(state): State<ApiState>,
    Path((id, session)): Path<(Uuid, u32)>,
    body: Bytes,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.active(id).await?;
    hosted.terminal(session)?.input(&body).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn resize(
    State(state): State<ApiState>,
    Path((id, session)): Path<(Uuid, u32)>,
    Json(size): Json<ResizeRequest>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.active(id).await?;
    hosted
        .terminal(session)?
        .resize(size.cols, size.rows)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub(super) struct OutputQuery {
    #[serde(default)]
    since: u64,
}

/// The session's output from `since` as the agent's frames; `x-sandbase-offset` says where
/// it starts (later than `since` when those bytes are no longer kept).
pub(super) async fn output(
    State(state): State<ApiState>,
    Path((id, session)): Path<(Uuid, u32)>,
    Query(query): Query<OutputQuery>,
) -> Result<Response, NodeError> {
    let hosted = state.node.active(id).await?;
    let terminal = hosted.terminal(session)?;
    let (stream, offset) = hosted.agent.pty_attach(session, query.since, false).await?;
    let attached = terminal.attach_guard();
    // The sandbox stays busy, and the client counted, while the answer streams.
    let body = futures_util::stream::unfold(
        (stream, hosted, attached),
        |(mut stream, hosted, attached)| async move {
            let mut buffer = vec![0u8; 64 * 1024];
            match stream.read(&mut buffer).await {
                Ok(0) => None,
                Ok(read) => {
                    buffer.truncate(read);
                    Some((
                        Ok::<_, std::io::Error>(Bytes::from(buffer)),
                        (stream, hosted, attached),
                    ))
                }
                Err(error) => Some((Err(error), (stream, hosted, attached))),
            }
        },
    );
    Ok((
        [
            (
                header::CONTENT_TYPE,
                "application/vnd.sandbase.frames".to_owned(),
            ),
            (
                header::HeaderName::from_static("x-sandbase-offset"),
                offset.to_string(),
            ),
        ],
        Body::from_stream(body),
    )
        .into_response())
}
