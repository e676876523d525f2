//! Templates are the operator's: importing, pulling and removing one goes to every live
//! worker, through internal routes that take the node token (the operator's credential).
//! Answers are NDJSON, one line per step and per worker, so a client can show progress.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub fn internal_router() -> Router<AppState> {
    Router::new()
        .route("/internal/v1/templates/{name}", put(import).delete(remove))
        .route("/internal/v1/templates/{name}/pull", post(pull))
}

fn check(state: &AppState, headers: &HeaderMap, name: &str) -> ApiResult<()> {
    if !state.workers.authenticates(headers) {
        return Err(ApiError::problem(
            StatusCode::UNAUTHORIZED,
            "invalid_node_token",
            "missing or wrong node token",
        ));
    }
    let valid = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if !valid {
        return Err(ApiError::InvalidRequest(
            "a template name has 1 to 64 lowercase letters, digits, `.`, `_` or `-`".to_owned(),
        ));
    }
    Ok(())
}

fn ndjson(receiver: mpsc::Receiver<serde_json::Value>) -> Response {
    let lines = futures_util::stream::unfold(receiver, |mut receiver| async move {
        let value = receiver.recv().await?;
        Some((
            Ok::<_, Infallible>(Bytes::from(format!("{value}\n"))),
            receiver,
        ))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

/// The outcome of one worker's answer, as a line.
async fn outcome(
    worker: &str,
    answer: Result<reqwest::Response, reqwest::Error>,
) -> serde_json::Value {
    match answer {
        Ok(answer) if answer.status().is_success() => json!({ "worker": worker, "done": true }),
        Ok(answer) => {
            let problem = crate::sandboxes::worker_problem(answer).await;
            json!({ "worker": worker, "error": { "code": problem.code(), "message": problem.to_string() } })
        }
        Err(error) => {
            json!({ "worker": worker, "error": { "code": "worker_unreachable", "message": error.to_string() } })
        }
    }
}

#[derive(Deserialize)]
struct ImportQuery {
    #[serde(default)]
    format: Option<String>,
}

/// Import an image archive (OCI layout or Docker archive; `?format=rootfs` for a plain root
/// file system tarball) as template `name` on every live worker.
async fn import(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<ImportQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    check(&state, &headers, &name)?;
    let limit = state.settings.sandboxes.upload_limit_bytes;
    let mut archive = Vec::new();
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk
            .map_err(|error| ApiError::InvalidRequest(format!("reading the upload: {error}")))?;
        if (archive.len() + chunk.len()) as u64 > limit {
            return Err(ApiError::PayloadTooLarge);
        }
        archive.extend_from_slice(&chunk);
    }
    let archive = Bytes::from(archive);
    let workers = state.workers.live().await?;
    let format = query.format.unwrap_or_else(|| "image".to_owned());
    let (sender, receiver) = mpsc::channel(16);
    tokio::spawn(async move {
        for worker in workers.iter() {
            let _ = sender
                .send(json!({ "worker": worker.id, "progress": "building the template" }))
                .await;
            let answer = state
                .workers
                .request(
                    reqwest::Method::PUT,
                    format!(
                        "{}/internal/v1/templates/{name}?format={format}",
                        worker.url
                    ),
                )
                .timeout(Duration::from_secs(1800))
                .body(archive.clone())
                .send()
                .await;
            let _ = sender.send(outcome(&worker.id, answer).await).await;
        }
    });
    Ok(ndjson(receiver))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PullRequest {
    reference: String,
    #[serde(default)]
    insecure_registries: Vec<String>,
}

/// Pull an image from a registry into template `name` on every live worker; each worker's
/// progress lines are passed on.
async fn pull(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    Json(request): Json<PullRequest>,
) -> ApiResult<Response> {
    check(&state, &headers, &name)?;
    let workers = state.workers.live().await?;
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(async move {
        for worker in workers.iter() {
            let answer = state
                .workers
                .request(
                    reqwest::Method::POST,
                    format!("{}/internal/v1/templates/{name}/pull", worker.url),
                )
                .timeout(Duration::from_secs(3600))
                .json(&json!({ "reference": request.reference, "insecure_registries": request.insecure_registries }))
                .send()
                .await;
            let answer = match answer {
                Ok(answer) if answer.status().is_success() => answer,
                other => {
                    let _ = sender.send(outcome(&worker.id, other).await).await;
                    continue;
                }
            };
            let mut pending = Vec::new();
            let mut stream = answer.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let Ok(chunk) = chunk else {
                    let _ = sender
                        .send(json!({ "worker": worker.id, "error": { "code": "worker_unreachable", "message": "the worker's answer broke off" } }))
                        .await;
                    break;
                };
                pending.extend_from_slice(&chunk);
                while let Some(end) = pending.iter().position(|byte| *byte == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    if let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_slice(&line)
                    {
                        fields.insert("worker".to_owned(), json!(worker.id));
                        let _ = sender.send(serde_json::Value::Object(fields)).await;
                    }
                }
            }
        }
    });
    Ok(ndjson(receiver))
}

/// Remove template `name` from every live worker.
async fn remove(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    check(&state, &headers, &name)?;
    let workers = state.workers.live().await?;
    let (sender, receiver) = mpsc::channel(16);
    tokio::spawn(async move {
        for worker in workers.iter() {
            let answer = state
                .workers
                .request(
                    reqwest::Method::DELETE,
                    format!("{}/internal/v1/templates/{name}", worker.url),
                )
                .send()
                .await;
            let _ = sender.send(outcome(&worker.id, answer).await).await;
        }
    });
    Ok(ndjson(receiver))
}
