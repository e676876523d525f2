//! Templates are the operator's: importing, pulling and removing one goes to every live
//! worker in turn. Each operation answers with a channel of progress lines (one per step
//! and per worker), which the HTTP layer streams as NDJSON.

use sandbase_api::internal::PullTemplate;
use sandbase_api::sandboxes::TemplateName;
use serde_json::json;
use tokio::sync::mpsc;

use crate::error::ApiResult;
use crate::state::AppState;
use crate::workers::WorkerError;

/// Progress lines of an operation on every worker.
pub type Progress = mpsc::Receiver<serde_json::Value>;

/// The outcome of one worker's answer, as a line.
fn outcome(worker: &str, answer: Result<(), WorkerError>) -> serde_json::Value {
    match answer {
        Ok(()) => json!({ "worker": worker, "done": true }),
        Err(error) => {
            json!({ "worker": worker, "error": { "code": error.code(), "message": error.to_string() } })
        }
    }
}

/// Builds template `name` on every live worker from an image archive (`format`: `image`)
/// or a root file system tarball (`rootfs`).
pub async fn import(
    state: AppState,
    name: TemplateName,
    format: String,
    archive: bytes::Bytes,
) -> ApiResult<Progress> {
    let workers = state.sandboxes.workers.live().await?;
    let (sender, receiver) = mpsc::channel(16);
    tokio::spawn(async move {
        for worker in workers.iter() {
            let _ = sender
                .send(json!({ "worker": worker.id, "progress": "building the template" }))
                .await;
            let answer = state
                .sandboxes
                .worker_client
                .import_template(
                    &crate::workers::registry::address(worker),
                    &name,
                    &format,
                    archive.clone(),
                )
                .await;
            let _ = sender.send(outcome(&worker.id, answer)).await;
        }
    });
    Ok(receiver)
}

/// Pulls an image into template `name` on every live worker; each worker's progress lines
/// are passed on with its id.
pub async fn pull(state: AppState, name: TemplateName, pull: PullTemplate) -> ApiResult<Progress> {
    let workers = state.sandboxes.workers.live().await?;
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(async move {
        for worker in workers.iter() {
            match state
                .sandboxes
                .worker_client
                .pull_template(&crate::workers::registry::address(worker), &name, &pull)
                .await
            {
                Ok(answer) => relay_progress(&worker.id, answer, &sender).await,
                Err(error) => {
                    let _ = sender.send(outcome(&worker.id, Err(error))).await;
                }
            }
        }
    });
    Ok(receiver)
}

/// Passes a worker's NDJSON progress on, each line marked with the worker's id.
async fn relay_progress(
    worker: &str,
    answer: reqwest::Response,
    sender: &mpsc::Sender<serde_json::Value>,
) {
    use futures_util::StreamExt;
    let mut pending = Vec::new();
    let mut stream = answer.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            let _ = sender
                .send(json!({ "worker": worker, "error": { "code": "worker_unreachable", "message": "the worker's answer broke off" } }))
                .await;
            return;
        };
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|byte| *byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_slice(&line) {
                fields.insert("worker".to_owned(), json!(worker));
                let _ = sender.send(serde_json::Value::Object(fields)).await;
            }
        }
    }
}

/// Removes template `name` from every live worker.
pub async fn remove(state: AppState, name: TemplateName) -> ApiResult<Progress> {
    let workers = state.sandboxes.workers.live().await?;
    let (sender, receiver) = mpsc::channel(16);
    tokio::spawn(async move {
        for worker in workers.iter() {
            let answer = state
                .sandboxes
                .worker_client
                .remove_template(&crate::workers::registry::address(worker), &name)
                .await;
            let _ = sender.send(outcome(&worker.id, answer)).await;
        }
    });
    Ok(receiver)
}
