//! Named commands (`exec_id`): started in a task of their own, read from an offset (whole or
//! followed as NDJSON), cancelled.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use sandbase_api::execs::{ExecEvent, OutputStream, valid_exec_id};
use sandbase_api::internal::Exec;
use serde::Deserialize;
use tokio::sync::watch;
use uuid::Uuid;

use crate::node::NodeError;
use crate::pause::Active;
use crate::tracked::{Claim, Tracked};
use crate::tracked_run::{self, Recording};

use super::support::{ApiState, ndjson_line, ndjson_response};

/// Starts `exec` under its `exec_id` (or answers the command already kept under it): its
/// events streamed from the start, or its whole result once it ends.
pub(super) async fn start(
    active: Active,
    exec: Exec,
    recording: Recording,
) -> Result<Response, NodeError> {
    let id = exec.exec_id.clone().unwrap_or_default();
    if !valid_exec_id(&id) {
        return Err(NodeError::Invalid("invalid exec_id".to_owned()));
    }
    if exec.background {
        return Err(NodeError::Invalid(
            "a named command is followed with GET …/execs/{exec_id}, not `background`".to_owned(),
        ));
    }
    // What could be refused is refused before anything runs under the id.
    active.exec_request(&exec)?;
    let stream = exec.stream;
    let tracked = match active.claim_exec(&id, &exec.argv, exec.session.as_deref())? {
        Claim::Existing(tracked) => tracked,
        Claim::New(tracked) => {
            let runner = Arc::clone(&tracked);
            match exec.session.clone() {
                Some(name) => {
                    let session = match active.session_for(&name, &exec).await {
                        Ok(session) => session,
                        Err(refused) => {
                            active.forget_exec(&id);
                            return Err(refused);
                        }
                    };
                    tokio::spawn(tracked_run::run_in_session(
                        active, runner, name, session, exec, recording,
                    ))
                }
                None => tokio::spawn(tracked_run::run_command(active, runner, exec, recording)),
            };
            tracked
        }
    };
    if stream {
        return Ok(follow(tracked, 0, true));
    }
    let mut changes = tracked.subscribe();
    loop {
        changes.borrow_and_update();
        if let Some(result) = tracked.result() {
            return Ok(Json(result).into_response());
        }
        if changes.changed().await.is_err() {
            return Err(NodeError::Internal(anyhow::anyhow!(
                "the command was dropped"
            )));
        }
    }
}

#[derive(Deserialize)]
pub(super) struct ReadQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    stream: bool,
}

/// A named command and its output from `offset`: JSON, or followed as NDJSON until it ends.
pub(super) async fn get(
    State(state): State<ApiState>,
    Path((id, exec_id)): Path<(Uuid, String)>,
    Query(query): Query<ReadQuery>,
) -> Result<Response, NodeError> {
    let tracked = state.node.get(id)?.tracked(&exec_id)?;
    if query.stream {
        return Ok(follow(tracked, query.offset, false));
    }
    Ok(Json(tracked.status(query.offset)).into_response())
}

/// Interrupts a named command (nothing when it ended); answers its state.
pub(super) async fn cancel(
    State(state): State<ApiState>,
    Path((id, exec_id)): Path<(Uuid, String)>,
) -> Result<Response, NodeError> {
    let hosted = state.node.active(id).await?;
    let tracked = hosted.tracked(&exec_id)?;
    hosted.cancel(&tracked).await?;
    let mut status = tracked.status(u64::MAX);
    status.output.clear();
    Ok(Json(status).into_response())
}

/// The command's events from `offset` as NDJSON lines, as they come: `{"pid","exec_id"}`
/// first when `with_start`, the output chunks with their offsets, the exit last.
fn follow(tracked: Arc<Tracked>, offset: u64, with_start: bool) -> Response {
    struct Following {
        tracked: Arc<Tracked>,
        changes: watch::Receiver<()>,
        offset: u64,
        start_due: bool,
        done: bool,
    }
    let state = Following {
        changes: tracked.subscribe(),
        tracked,
        offset,
        start_due: with_start,
        done: false,
    };
    let lines = futures_util::stream::unfold(state, |mut state| async move {
        loop {
            if state.done {
                return None;
            }
            state.changes.borrow_and_update();
            let read = state.tracked.read(state.offset);
            let mut lines = String::new();
            if state.start_due
                && let Some(pid) = read.pid
            {
                state.start_due = false;
                lines.push_str(&ndjson_line(&ExecEvent::Started {
                    pid,
                    exec_id: Some(state.tracked.id.clone()),
                }));
            }
            for chunk in read.chunks {
                lines.push_str(&ndjson_line(&match chunk.stream {
                    OutputStream::Stdout => ExecEvent::Stdout {
                        stdout: chunk.text,
                        offset: Some(chunk.offset),
                    },
                    OutputStream::Stderr => ExecEvent::Stderr {
                        stderr: chunk.text,
                        offset: Some(chunk.offset),
                    },
                }));
            }
            state.offset = read.next;
            if let Some(exit) = read.exit {
                state.done = true;
                lines.push_str(&ndjson_line(&ExecEvent::Exit {
                    exit_code: exit.code,
                    signal: exit.signal,
                    timed_out: exit.timed_out,
                    duration_ms: exit.duration_ms,
                }));
            }
            if !lines.is_empty() {
                return Some((Ok::<_, Infallible>(Bytes::from(lines)), state));
            }
            if state.changes.changed().await.is_err() {
                return None;
            }
        }
    });
    ndjson_response(Body::from_stream(lines))
}
