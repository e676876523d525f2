//! The worker's internal HTTP API, called by the gateway with the node token. Errors use the
//! public error body, so the gateway can pass them on.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use sandbase_agent::protocol::{self, AgentError, ExitInfo, Owner};
use sandbase_api::internal::{CreateSandbox, Exec, NODE_TOKEN_HEADER, paths};
use sandbase_api::sandboxes::{
    BackgroundStarted, DirectoryListing, ExecEvent, ExecResult, FileInfo, ProcessList, TemplateName,
};
use sandbase_api::{ErrorBody, ErrorDetail};
use serde::Deserialize;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::agent_client::{self, Refused};
use crate::node::{Hosted, Node, NodeError};
use crate::spec::{SANDBOX_USER, WORK_DIR};

/// Most output a synchronous command returns per stream; the rest is dropped (`truncated`).
const SYNC_OUTPUT_LIMIT: usize = 8 * 1024 * 1024;

#[derive(Clone)]
struct ApiState {
    node: Arc<Node>,
    token: Arc<str>,
}

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
        .route(&paths::sandbox_part("{id}", "exec"), post(exec))
        .route(&paths::sandbox_part("{id}", "processes"), get(processes))
        .route(
            &paths::sandbox_part("{id}", "egress-policy"),
            axum::routing::put(set_egress_policy),
        )
        .route(&paths::sandbox_part("{id}", "egress"), get(egress_flows))
        .route(&paths::process("{id}", "{pid}"), get(process))
        .route(
            &paths::process_part("{id}", "{pid}", "stdin"),
            post(process_stdin),
        )
        .route(
            &paths::process_part("{id}", "{pid}", "signal"),
            post(process_signal),
        )
        .route(
            &paths::sandbox_part("{id}", "files"),
            get(read_path).put(write_file).delete(remove_path),
        )
        .route(
            &paths::sandbox_part("{id}", "archive"),
            get(archive_out).put(archive_in),
        )
        .route(
            &paths::template("{name}"),
            axum::routing::put(import_template).delete(remove_template),
        )
        .route(&paths::template_pull("{name}"), post(pull_template))
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

fn error(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(ErrorBody {
            error: ErrorDetail {
                code: code.to_owned(),
                message,
                request_id: None,
            },
        }),
    )
        .into_response()
}

impl IntoResponse for NodeError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            NodeError::SandboxNotFound => (StatusCode::NOT_FOUND, "sandbox_not_found"),
            NodeError::ProcessNotFound => (StatusCode::NOT_FOUND, "process_not_found"),
            NodeError::AtCapacity => (StatusCode::SERVICE_UNAVAILABLE, "at_capacity"),
            NodeError::TemplateNotFound(_) => (StatusCode::NOT_FOUND, "template_not_found"),
            NodeError::Exists => (StatusCode::CONFLICT, "sandbox_exists"),
            NodeError::TemplateExists(_) => (StatusCode::CONFLICT, "template_exists"),
            NodeError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            NodeError::Refused(Refused(refusal)) => refusal_status(refusal),
            NodeError::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "internal API call failed");
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error on the worker".to_owned(),
                );
            }
        };
        error(status, code, self.to_string())
    }
}

/// The status and code of an agent's refusal of a file operation.
fn refusal_status(refusal: &AgentError) -> (StatusCode, &'static str) {
    match refusal.kind.as_str() {
        "not_found" => (StatusCode::NOT_FOUND, "path_not_found"),
        "permission_denied" => (StatusCode::FORBIDDEN, "permission_denied"),
        "already_exists" => (StatusCode::CONFLICT, "already_exists"),
        "not_a_directory" => (StatusCode::BAD_REQUEST, "not_a_directory"),
        "is_a_directory" => (StatusCode::BAD_REQUEST, "is_a_directory"),
        "not_empty" => (StatusCode::CONFLICT, "directory_not_empty"),
        "no_space" => (StatusCode::INSUFFICIENT_STORAGE, "disk_full"),
        "invalid" => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
        "spawn_failed" => (StatusCode::UNPROCESSABLE_ENTITY, "spawn_failed"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "sandbox_io_error"),
    }
}

async fn health(State(state): State<ApiState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "hosted": state.node.ids().len(),
        "capacity": state.node.capacity(),
    }))
}

async fn create(
    State(state): State<ApiState>,
    Json(request): Json<CreateSandbox>,
) -> Result<StatusCode, NodeError> {
    state.node.create(request).await?;
    Ok(StatusCode::CREATED)
}

async fn list(State(state): State<ApiState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "sandboxes": state.node.ids() }))
}

async fn destroy(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, NodeError> {
    state.node.destroy(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn exec(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Json(exec): Json<Exec>,
) -> Result<Response, NodeError> {
    let hosted = state.node.get(id)?;
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
        return Ok(stream_events(pid, events));
    }
    collect_events(events, started)
        .await
        .map(|result| Json(result).into_response())
}

/// A command the agent could not start (not found, not executable) answers like a shell
/// would: exit code 127 (126 when it could not be run) and the reason on stderr.
fn command_not_started(
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
            ExecEvent::Stderr { stderr },
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

async fn collect_events(
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

fn result_of(
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
    }
}

fn ndjson_line(event: &ExecEvent) -> String {
    let mut line = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
    line.push('\n');
    line
}

fn ndjson_response(body: Body) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// The command's events as NDJSON lines, flushed as they come.
fn stream_events(
    pid: u32,
    events: mpsc::Receiver<anyhow::Result<agent_client::ExecEvent>>,
) -> Response {
    struct Streaming {
        events: mpsc::Receiver<anyhow::Result<agent_client::ExecEvent>>,
        stdout: Utf8Carry,
        stderr: Utf8Carry,
        done: bool,
    }
    let state = Streaming {
        events,
        stdout: Utf8Carry::default(),
        stderr: Utf8Carry::default(),
        done: false,
    };
    let first = futures_util::stream::once(async move {
        Ok::<_, Infallible>(Bytes::from(ndjson_line(&ExecEvent::Started { pid })))
    });
    let lines = futures_util::stream::unfold(state, |mut state| async move {
        if state.done {
            return None;
        }
        let line = match state.events.recv().await {
            Some(Ok(agent_client::ExecEvent::Started { pid })) => {
                ndjson_line(&ExecEvent::Started { pid })
            }
            Some(Ok(agent_client::ExecEvent::Stdout(bytes))) => ndjson_line(&ExecEvent::Stdout {
                stdout: state.stdout.push(&bytes),
            }),
            Some(Ok(agent_client::ExecEvent::Stderr(bytes))) => ndjson_line(&ExecEvent::Stderr {
                stderr: state.stderr.push(&bytes),
            }),
            Some(Ok(agent_client::ExecEvent::Exit(exit))) => {
                state.done = true;
                let mut lines = String::new();
                for (rest, is_stdout) in [
                    (state.stdout.finish(), true),
                    (state.stderr.finish(), false),
                ] {
                    if !rest.is_empty() {
                        lines.push_str(&ndjson_line(&if is_stdout {
                            ExecEvent::Stdout { stdout: rest }
                        } else {
                            ExecEvent::Stderr { stderr: rest }
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

/// Turns chunks of bytes into text without splitting a UTF-8 character across chunks.
#[derive(Default)]
struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let complete = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // An incomplete character at the end waits for the next chunk.
            Err(error) if error.error_len().is_none() => error.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let ready: Vec<u8> = self.pending.drain(..complete).collect();
        String::from_utf8_lossy(&ready).into_owned()
    }

    fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

async fn set_egress_policy(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Json(policy): Json<sandbase_api::sandboxes::EgressPolicy>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.get(id)?;
    let (Some(network), Some(link)) = (state.node.network(), &hosted.link) else {
        return Err(NodeError::Invalid(
            "this sandbox was created without egress".to_owned(),
        ));
    };
    let policy = sandbase_egress::Policy::parse(&policy.allow, &policy.deny)
        .map_err(|why| NodeError::Invalid(format!("`egress`: {why}")))?;
    network.set_policy(link, id, policy).await;
    Ok(StatusCode::NO_CONTENT)
}

async fn egress_flows(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
) -> Result<Json<sandbase_api::sandboxes::EgressFlowList>, NodeError> {
    state.node.get(id)?;
    let flows = state
        .node
        .network()
        .map(|network| network.flows(id))
        .unwrap_or_default();
    Ok(Json(sandbase_api::sandboxes::EgressFlowList {
        flows: flows
            .into_iter()
            .map(|flow| {
                let (decision, reason) = match flow.decision {
                    sandbase_egress::proxy::Decision::Allowed if !flow.credentials.is_empty() => {
                        ("injected", None)
                    }
                    sandbase_egress::proxy::Decision::Allowed => ("allowed", None),
                    sandbase_egress::proxy::Decision::Denied(why) => ("denied", Some(why)),
                    sandbase_egress::proxy::Decision::Failed(why) => ("failed", Some(why)),
                };
                sandbase_api::sandboxes::EgressFlow {
                    at: chrono::DateTime::<chrono::Utc>::from(flow.started_at),
                    host: flow.host,
                    port: flow.port,
                    mode: flow.mode.to_owned(),
                    decision: decision.to_owned(),
                    credentials: flow.credentials,
                    reason,
                    address: flow.address.map(|address| address.to_string()),
                    bytes_up: flow.bytes_up,
                    bytes_down: flow.bytes_down,
                    duration_ms: flow.duration.as_millis() as u64,
                }
            })
            .collect(),
    }))
}

async fn processes(
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

async fn process(
    State(state): State<ApiState>,
    Path((id, pid)): Path<(Uuid, u32)>,
) -> Result<Response, NodeError> {
    let process = state.node.get(id)?.process(pid)?;
    Ok(Json(process.describe(true)).into_response())
}

#[derive(Deserialize)]
struct StdinQuery {
    #[serde(default)]
    close: bool,
}

async fn process_stdin(
    State(state): State<ApiState>,
    Path((id, pid)): Path<(Uuid, u32)>,
    Query(query): Query<StdinQuery>,
    body: Bytes,
) -> Result<StatusCode, NodeError> {
    let process = state.node.get(id)?.process(pid)?;
    process.send_stdin(&body, query.close).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct SignalBody {
    signal: i32,
}

async fn process_signal(
    State(state): State<ApiState>,
    Path((id, pid)): Path<(Uuid, u32)>,
    Json(body): Json<SignalBody>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.get(id)?;
    let process = hosted.process(pid)?;
    if !process.running() {
        return Err(NodeError::Invalid(format!("process {pid} has exited")));
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

#[derive(Deserialize)]
struct PathQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

/// A path inside the sandbox: relative ones are under `/work`.
fn sandbox_path(path: &str) -> Result<String, NodeError> {
    if path.is_empty() || path.contains('\0') {
        return Err(NodeError::Invalid(
            "`path` must be a non-empty path without NUL bytes".to_owned(),
        ));
    }
    Ok(if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{WORK_DIR}/{path}")
    })
}

fn file_info(name: String, stat: protocol::Stat) -> FileInfo {
    FileInfo {
        name,
        path: stat.path,
        kind: stat.kind,
        size: stat.size,
        mode: stat.mode,
        modified: chrono::DateTime::from_timestamp(stat.modified, 0).unwrap_or_default(),
        link_target: stat.link_target,
    }
}

fn name_of(path: &str) -> String {
    path.rsplit('/')
        .find(|part| !part.is_empty())
        .unwrap_or("/")
        .to_owned()
}

fn user() -> Owner {
    Owner {
        uid: SANDBOX_USER,
        gid: SANDBOX_USER,
    }
}

/// A file's bytes, or a directory's listing as JSON.
async fn read_path(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
) -> Result<Response, NodeError> {
    let hosted = state.node.get(id)?;
    let path = sandbox_path(&query.path)?;
    let is_dir = match hosted
        .agent
        .simple(&protocol::Request::Stat { path: path.clone() })
        .await?
    {
        protocol::Reply::Ok(Some(stat)) => stat.kind == "dir",
        _ => false,
    };
    if is_dir {
        let entries = hosted.agent.list(&path).await?;
        return Ok(Json(DirectoryListing {
            path,
            entries: entries
                .into_iter()
                .map(|entry| file_info(entry.name, entry.stat))
                .collect(),
        })
        .into_response());
    }
    let (stat, chunks) = hosted
        .agent
        .download(&protocol::Request::ReadFile { path })
        .await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::HeaderName::from_static("x-sandbase-file-size"),
                stat.size.to_string(),
            ),
        ],
        byte_stream(chunks),
    )
        .into_response())
}

fn byte_stream(chunks: mpsc::Receiver<anyhow::Result<Vec<u8>>>) -> Body {
    Body::from_stream(futures_util::stream::unfold(
        chunks,
        |mut chunks| async move {
            let chunk = chunks.recv().await?;
            Some((
                chunk
                    .map(Bytes::from)
                    .map_err(|error| std::io::Error::other(format!("{error:#}"))),
                chunks,
            ))
        },
    ))
}

async fn write_file(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
    body: Body,
) -> Result<Json<FileInfo>, NodeError> {
    let hosted = state.node.get(id)?;
    let path = sandbox_path(&query.path)?;
    let stat = hosted
        .agent
        .upload(
            &protocol::Request::WriteFile {
                path: path.clone(),
                mode: None,
                owner: Some(user()),
            },
            body.into_data_stream(),
        )
        .await?;
    Ok(Json(file_info(name_of(&path), stat)))
}

async fn remove_path(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.get(id)?;
    let path = sandbox_path(&query.path)?;
    hosted
        .agent
        .simple(&protocol::Request::Remove {
            path,
            recursive: query.recursive,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn archive_out(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
) -> Result<Response, NodeError> {
    let hosted = state.node.get(id)?;
    let path = sandbox_path(&query.path)?;
    let (_, chunks) = hosted
        .agent
        .download(&protocol::Request::TarOut { path })
        .await?;
    Ok((
        [(header::CONTENT_TYPE, "application/x-tar")],
        byte_stream(chunks),
    )
        .into_response())
}

async fn archive_in(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<FileInfo>, NodeError> {
    let hosted: Arc<Hosted> = state.node.get(id)?;
    let path = sandbox_path(&query.path)?;
    // Inputs of runs are unpacked as the sandbox's root: the command (the sandbox user)
    // can read but not change them.
    let owner = match headers
        .get("x-sandbase-owner")
        .and_then(|value| value.to_str().ok())
    {
        Some("root") => None,
        _ => Some(user()),
    };
    let stat = hosted
        .agent
        .upload(
            &protocol::Request::TarIn {
                path: path.clone(),
                owner,
            },
            body.into_data_stream(),
        )
        .await?;
    Ok(Json(file_info(name_of(&path), stat)))
}

/// Template names follow the one rule of [`TemplateName`].
fn check_template_name(name: &str) -> Result<(), NodeError> {
    TemplateName::parse(name)
        .map(drop)
        .map_err(NodeError::Invalid)
}

#[derive(Deserialize)]
struct ImportQuery {
    /// `image` (OCI layout or Docker archive, the default) or `rootfs` (a plain tarball).
    #[serde(default)]
    format: Option<String>,
}

/// Builds a template from the uploaded archive.
async fn import_template(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(query): Query<ImportQuery>,
    body: Body,
) -> Result<StatusCode, NodeError> {
    check_template_name(&name)?;
    let rootfs_tarball = match query.format.as_deref() {
        None | Some("image") => false,
        Some("rootfs") => true,
        Some(other) => return Err(NodeError::Invalid(format!("unknown format `{other}`"))),
    };
    let file =
        std::env::temp_dir().join(format!("sandbase-import-{}.tar", Uuid::new_v4().simple()));
    let saved = save_body(&file, body).await;
    let result = match saved {
        Ok(()) => {
            let archive = file.clone();
            state
                .node
                .add_template(&name, move |rootfs, base| {
                    if rootfs_tarball {
                        // Unpacked like an image layer: nothing lands outside the root.
                        crate::templates::from_layers(rootfs, std::slice::from_ref(&archive), base)
                    } else {
                        crate::templates::from_image_archive(rootfs, &archive, base)
                    }
                })
                .await
        }
        Err(error) => Err(NodeError::Internal(error)),
    };
    let _ = tokio::fs::remove_file(&file).await;
    result.map(|()| StatusCode::CREATED)
}

async fn save_body(path: &std::path::Path, body: Body) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::File::create(path).await?;
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        file.write_all(&chunk?).await?;
    }
    file.sync_all().await?;
    Ok(())
}

async fn remove_template(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, NodeError> {
    check_template_name(&name)?;
    state.node.remove_template(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct PullBody {
    reference: String,
    #[serde(default)]
    insecure_registries: Vec<String>,
}

/// Pulls an image from a registry into a template; answers NDJSON progress lines
/// (`{"progress":"…"}`) ending in `{"done":true}` or `{"error":{…}}`.
async fn pull_template(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Json(body): Json<PullBody>,
) -> Result<Response, NodeError> {
    check_template_name(&name)?;
    let reference = crate::registry::Reference::parse(&body.reference)
        .map_err(|error| NodeError::Invalid(format!("{error:#}")))?;
    if state
        .node
        .worker()
        .containerd()
        .template_exists(&name)
        .await?
    {
        return Err(NodeError::TemplateExists(name));
    }
    let (sender, receiver) = mpsc::channel::<String>(64);
    let node = Arc::clone(&state.node);
    tokio::spawn(async move {
        let line = |value: serde_json::Value| format!("{value}\n");
        let layout =
            std::env::temp_dir().join(format!("sandbase-pull-{}", Uuid::new_v4().simple()));
        let result = async {
            let puller = crate::registry::Puller::new(body.insecure_registries)?;
            let progress_sender = sender.clone();
            let mut report = move |progress: serde_json::Value| {
                let _ = progress_sender.try_send(line(progress));
            };
            let layers = puller.pull(&reference, &layout, &mut report).await?;
            let _ = sender
                .send(line(
                    serde_json::json!({ "progress": "building the template" }),
                ))
                .await;
            node.add_template(&name, move |rootfs, base| {
                crate::templates::from_layers(rootfs, &layers, base)
            })
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))
        }
        .await;
        let _ = tokio::fs::remove_dir_all(&layout).await;
        let last = match result {
            Ok(()) => line(serde_json::json!({ "done": true })),
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "pulling an image failed");
                line(
                    serde_json::json!({ "error": { "code": "pull_failed", "message": format!("{error:#}") } }),
                )
            }
        };
        let _ = sender.send(last).await;
    });
    let lines = futures_util::stream::unfold(receiver, |mut receiver| async move {
        let line = receiver.recv().await?;
        Some((Ok::<_, Infallible>(Bytes::from(line)), receiver))
    });
    Ok(ndjson_response(Body::from_stream(lines)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_are_never_split_across_chunks() {
        let text = "héllo wörld ✓";
        let bytes = text.as_bytes();
        for split in 0..bytes.len() {
            let mut carry = Utf8Carry::default();
            let mut out = carry.push(&bytes[..split]);
            out.push_str(&carry.push(&bytes[split..]));
            out.push_str(&carry.finish());
            assert_eq!(out, text, "split at {split}");
        }
        let mut carry = Utf8Carry::default();
        assert_eq!(carry.push(&[0xff, b'a']), "\u{fffd}a");
    }

    #[test]
    fn relative_paths_are_under_work() {
        assert_eq!(sandbox_path("a/b").unwrap(), "/work/a/b");
        assert_eq!(sandbox_path("/etc/x").unwrap(), "/etc/x");
        assert!(sandbox_path("").is_err());
        assert!(sandbox_path("a\0b").is_err());
        assert_eq!(name_of("/work/a/"), "a");
        assert_eq!(name_of("/"), "/");
    }
}
