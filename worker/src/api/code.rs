//! The code endpoint: a call run in a context (whole, or streamed as NDJSON), contexts made,
//! listed, interrupted and deleted.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandbase_api::ErrorDetail;
use sandbase_api::code::{
    CodeContextList, CodeEvent, CodeResult, CreateCodeContextRequest, DEFAULT_CONTEXT,
    RunCodeRequest,
};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::code::DEFAULT_TIMEOUT;
use crate::node::NodeError;

use super::support::{ApiState, ndjson_response};

/// Runs a call in its context, in a task of its own (it ends whatever happens to the
/// caller, so the next call finds the context idle); its events as they come.
pub(super) async fn run(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Json(request): Json<RunCodeRequest>,
) -> Result<Response, NodeError> {
    let hosted = state.node.active(id).await?;
    let name = request.context.as_deref().unwrap_or(DEFAULT_CONTEXT);
    let context = hosted.code_context(name).await?;
    let timeout = request
        .timeout_secs
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    let (sender, mut events) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut sink = |event: CodeEvent| {
            let _ = sender.send(event);
        };
        if let Err(error) = context
            .run(&hosted.agent, &request.code, timeout, &mut sink)
            .await
        {
            sink(CodeEvent::Error {
                error: ErrorDetail {
                    code: "context_ended".to_owned(),
                    message: format!("{error:#}"),
                    request_id: None,
                },
            });
        }
        drop(hosted);
    });
    if request.stream {
        let lines =
            futures_util::stream::poll_fn(move |context| events.poll_recv(context)).map(|event| {
                let mut line = serde_json::to_string(&event).unwrap_or_default();
                line.push('\n');
                Ok::<_, Infallible>(Bytes::from(line))
            });
        return Ok(ndjson_response(Body::from_stream(lines)));
    }
    let mut result = CodeResult::default();
    while let Some(event) = events.recv().await {
        match event {
            CodeEvent::Stdout { stdout } => result.stdout.push_str(&stdout),
            CodeEvent::Stderr { stderr } => result.stderr.push_str(&stderr),
            CodeEvent::Result {
                result: shown,
                main,
            } => {
                if main {
                    result.main = Some(shown.clone());
                }
                result.results.push(shown);
            }
            CodeEvent::Exception { exception } => result.exception = Some(exception),
            CodeEvent::Done { done } => {
                result.execution_count = done.execution_count;
                result.duration_ms = done.duration_ms;
                result.timed_out = done.timed_out;
                return Ok(Json(result).into_response());
            }
            CodeEvent::Error { error } => {
                return Err(NodeError::Internal(anyhow::anyhow!(error.message)));
            }
        }
    }
    Err(NodeError::Internal(anyhow::anyhow!(
        "the call ended without its end"
    )))
}

pub(super) async fn create_context(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Json(request): Json<CreateCodeContextRequest>,
) -> Result<Response, NodeError> {
    let hosted = state.node.active(id).await?;
    let name = format!("ctx-{}", &Uuid::new_v4().simple().to_string()[..12]);
    let context = hosted.make_code_context(&name, &request).await?;
    Ok((StatusCode::CREATED, Json(context.describe())).into_response())
}

pub(super) async fn list_contexts(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
) -> Result<Json<CodeContextList>, NodeError> {
    let hosted = state.node.get(id)?;
    let contexts = hosted.code_contexts().await;
    Ok(Json(CodeContextList {
        contexts: contexts.iter().map(|context| context.describe()).collect(),
    }))
}

pub(super) async fn delete_context(
    State(state): State<ApiState>,
    Path((id, context)): Path<(Uuid, String)>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.active(id).await?;
    hosted.remove_code_context(&context).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn interrupt(
    State(state): State<ApiState>,
    Path((id, context)): Path<(Uuid, String)>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.active(id).await?;
    let found = hosted
        .code_contexts()
        .await
        .into_iter()
        .find(|kept| kept.id == context)
        .ok_or(NodeError::ContextNotFound)?;
    found.interrupt(&hosted.agent).await;
    Ok(StatusCode::NO_CONTENT)
}
