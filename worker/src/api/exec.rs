//! Commands: whole results, NDJSON streams, background processes with stdin and signals.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandbase_agent::protocol::{self, ExitInfo};
use sandbase_api::ErrorDetail;
use sandbase_api::internal::Exec;
use sandbase_api::sandboxes::{BackgroundStarted, ExecEvent, ExecResult, ProcessList};
use serde::Deserialize;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::agent_client::{self, Refused};
use crate::command_recording::CommandCast;
use crate::node::NodeError;
use crate::pause::Active;
use crate::recording::RecordingSink;
use crate::utf8::Utf8Carry;

use super::support::{ApiState, SYNC_OUTPUT_LIMIT, ndjson_line, ndjson_response};

pub(super) async fn exec(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Json(exec): Json<Exec>,
) -> Result<Response, NodeError> {
    let hosted = state.node.active(id).await?;
    // The command is recorded when the gateway asks (a run's own commands are not).
    let kind = if exec.session.is_some() {
        "shell"
    } else {
        "exec"
    };
    let recording = exec
        .record
        .filter(|_| !exec.background)
        .zip(state.node.recording_sink())
        .map(|(by, sink)| {
            let cast = CommandCast::start(id, kind, &exec.argv, exec.session.as_deref(), by);
            (cast, sink)
        });
    if let Some(session) = &exec.session {
        if exec.background || exec.stdin.is_some() {
            return Err(NodeError::Invalid(
                "a session command takes no `stdin` and does not run in the background".to_owned(),
            ));
        }
        if !crate::session::valid_name(session) {
            return Err(NodeError::Invalid("invalid session name".to_owned()));
        }
    }
    // A named command, or a session's streamed one, runs in a task of its own.
    if exec.exec_id.is_some() || (exec.session.is_some() && exec.stream) {
        let mut exec = exec;
        exec.exec_id
            .get_or_insert_with(|| format!("session-{}", Uuid::new_v4()));
        return super::execs::start(hosted, exec, recording).await;
    }
    if let Some(session) = &exec.session {
        let result = hosted
            .run_in_session(session, &exec, SYNC_OUTPUT_LIMIT)
            .await?;
        record_result(recording, &result);
        return Ok(Json(result).into_response());
    }
    if exec.background {
        let pid = hosted
            .start_background(&exec, state.node.process_output_limit())
            .await?;
        return Ok((StatusCode::CREATED, Json(BackgroundStarted { pid })).into_response());
    }
    let request = hosted.exec_request(&exec)?;
    let started = Instant::now();
    let stdin = exec.stdin.map(String::into_bytes);
    let mut events = hosted.agent.exec(request, stdin).await?;
    // The first event says whether the command started at all.
    let pid = match events.recv().await {
        Some(Ok(agent_client::ExecEvent::Started { pid })) => pid,
        Some(Err(failure)) => return command_not_started(failure, exec.stream, started),
        other => {
            return Err(NodeError::Internal(anyhow::anyhow!(
                "unexpected first event {other:?}"
            )));
        }
    };
    if exec.stream {
        return Ok(stream_events(pid, events, hosted, recording));
    }
    let result = collect_events(events, started).await?;
    record_result(recording, &result);
    Ok(Json(result).into_response())
}

/// A whole result into its command's recording, which is then sent.
fn record_result(recording: Option<(CommandCast, Arc<RecordingSink>)>, result: &ExecResult) {
    if let Some((mut cast, sink)) = recording {
        cast.stdout(result.stdout.as_bytes());
        cast.stderr(result.stderr.as_bytes());
        cast.send(sink, Some(result.exit_code));
    }
}

/// A command the agent could not start (not found, not executable) answers like a shell
/// would: exit code 127 (126 when it could not be run) and the reason on stderr.
pub(super) fn command_not_started(
    failure: anyhow::Error,
    stream: bool,
    started: Instant,
) -> Result<Response, NodeError> {
    let refusal = match failure.downcast::<Refused>() {
        Ok(Refused(refusal)) => refusal,
        Err(other) => return Err(NodeError::from(other)),
    };
    let exit_code = if refusal.kind == "not_found" {
        127
    } else {
        126
    };
    let stderr = format!("{}\n", refusal.message);
    let duration_ms = started.elapsed().as_millis() as u64;
    if stream {
        let lines = [
            ExecEvent::stderr(stderr),
            ExecEvent::Exit {
                exit_code,
                signal: None,
                timed_out: false,
                duration_ms,
            },
        ];
        let body: String = lines.iter().map(ndjson_line).collect();
        return Ok(ndjson_response(Body::from(body)));
    }
    Ok(Json(ExecResult {
        exit_code,
        stderr,
        duration_ms,
        ..Default::default()
    })
    .into_response())
}

pub(super) async fn collect_events(
    mut events: mpsc::Receiver<anyhow::Result<agent_client::ExecEvent>>,
    started: Instant,
) -> Result<ExecResult, NodeError> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut truncated = false;
    let mut append = |into: &mut Vec<u8>, bytes: Vec<u8>| {
        let room = SYNC_OUTPUT_LIMIT.saturating_sub(into.len());
        if bytes.len() > room {
            truncated = true;
        }
        into.extend_from_slice(&bytes[..bytes.len().min(room)]);
    };
    while let Some(event) = events.recv().await {
        match event? {
            agent_client::ExecEvent::Started { .. } => {}
            agent_client::ExecEvent::Stdout(bytes) => append(&mut stdout, bytes),
            agent_client::ExecEvent::Stderr(bytes) => append(&mut stderr, bytes),
            agent_client::ExecEvent::Exit(exit) => {
                return Ok(result_of(exit, stdout, stderr, truncated, started));
            }
        }
    }
    Err(NodeError::Internal(anyhow::anyhow!(
        "the command's events ended without an exit"
    )))
}

pub(super) fn result_of(
    exit: ExitInfo,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
    started: Instant,
) -> ExecResult {
    ExecResult {
        exit_code: exit.code,
        signal: exit.signal,
        timed_out: exit.timed_out,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        truncated,
        duration_ms: started.elapsed().as_millis() as u64,
        exec_id: None,
    }
}

/// The command's events as NDJSON lines, flushed as they come.
pub(super) fn stream_events(
    pid: u32,
    events: mpsc::Receiver<anyhow::Result<agent_client::ExecEvent>>,
    active: Active,
    recording: Option<(CommandCast, Arc<RecordingSink>)>,
) -> Response {
    struct Streaming {
        events: mpsc::Receiver<anyhow::Result<agent_client::ExecEvent>>,
        stdout: Utf8Carry,
        stderr: Utf8Carry,
        done: bool,
        recording: Option<(CommandCast, Arc<RecordingSink>)>,
        /// The sandbox stays busy while the answer streams.
        _active: Active,
    }
    let state = Streaming {
        _active: active,
        events,
        stdout: Utf8Carry::default(),
        stderr: Utf8Carry::default(),
        done: false,
        recording,
    };
    let first = futures_util::stream::once(async move {
        Ok::<_, Infallible>(Bytes::from(ndjson_line(&ExecEvent::Started {
            pid,
            exec_id: None,
        })))
    });
    let lines = futures_util::stream::unfold(state, |mut state| async move {
        if state.done {
            return None;
        }
        let line = match state.events.recv().await {
            Some(Ok(agent_client::ExecEvent::Started { pid })) => {
                ndjson_line(&ExecEvent::Started { pid, exec_id: None })
            }
            Some(Ok(agent_client::ExecEvent::Stdout(bytes))) => {
                if let Some((cast, _)) = &mut state.recording {
                    cast.stdout(&bytes);
                }
                ndjson_line(&ExecEvent::stdout(state.stdout.push(&bytes)))
            }
            Some(Ok(agent_client::ExecEvent::Stderr(bytes))) => {
                if let Some((cast, _)) = &mut state.recording {
                    cast.stderr(&bytes);
                }
                ndjson_line(&ExecEvent::stderr(state.stderr.push(&bytes)))
            }
            Some(Ok(agent_client::ExecEvent::Exit(exit))) => {
                state.done = true;
                if let Some((cast, sink)) = state.recording.take() {
                    cast.send(sink, Some(exit.code));
                }
                let mut lines = String::new();
                for (rest, is_stdout) in [
                    (state.stdout.finish(), true),
                    (state.stderr.finish(), false),
                ] {
                    if !rest.is_empty() {
                        lines.push_str(&ndjson_line(&if is_stdout {
                            ExecEvent::stdout(rest)
                        } else {
                            ExecEvent::stderr(rest)
                        }));
                    }
                }
                lines.push_str(&ndjson_line(&ExecEvent::Exit {
                    exit_code: exit.code,
                    signal: exit.signal,
                    timed_out: exit.timed_out,
                    duration_ms: exit.duration_ms,
                }));
                lines
            }
            Some(Err(failure)) => {
                state.done = true;
                tracing::warn!(error = format!("{failure:#}"), "a streamed command failed");
                ndjson_line(&ExecEvent::Error {
                    error: ErrorDetail {
                        code: "exec_failed".to_owned(),
                        message: "the command's output stream broke".to_owned(),
                        request_id: None,
                    },
                })
            }
            None => return None,
        };
        Some((Ok::<_, Infallible>(Bytes::from(line)), state))
    });
    ndjson_response(Body::from_stream(first.chain(lines)))
}

pub(super) async fn processes(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
) -> Result<Json<ProcessList>, NodeError> {
    let hosted = state.node.get(id)?;
    Ok(Json(ProcessList {
        processes: hosted
            .processes()
            .iter()
            .map(|process| process.describe(false))
            .collect(),
    }))
}

pub(super) async fn process(
    State(state): State<ApiState>,
    Path((id, pid)): Path<(Uuid, u32)>,
) -> Result<Response, NodeError> {
    let process = state.node.get(id)?.process(pid)?;
    Ok(Json(process.describe(true)).into_response())
}

#[derive(Deserialize)]
pub(super) struct StdinQuery {
    #[serde(default)]
    close: bool,
}

pub(super) async fn process_stdin(
    State(state): State<ApiState>,
    Path((id, pid)): Path<(Uuid, u32)>,
    Query(query): Query<StdinQuery>,
    body: Bytes,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.active(id).await?;
    let process = hosted.process(pid)?;
    process.send_stdin(&body, query.close).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub(super) struct SignalBody {
    signal: i32,
}

pub(super) async fn process_signal(
    State(state): State<ApiState>,
    Path((id, pid)): Path<(Uuid, u32)>,
    Json(body): Json<SignalBody>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.active(id).await?;
    let process = hosted.process(pid)?;
    if !process.running() {
        return Err(NodeError::ProcessExited(pid));
    }
    hosted
        .agent
        .simple(&protocol::Request::Signal {
            pid,
            signal: body.signal,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
