//! Terminal (PTY) sessions of a team's sandbox: open, list, close, type, resize, read the
//! output from an offset, and attach over a WebSocket (binary frames are terminal bytes both
//! ways; text frames are JSON control: `resize` in, `attached`, `lag` and `exit` out).

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use sandbase_api::terminals::{
    AttachTicket, OpenTerminalRequest, ResizeRequest, Terminal, TerminalList,
};
use sandbase_api::{ErrorBody, Role};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery, TerminalCaller};
use crate::http::worker_answer::worker_answer;
use crate::sandboxes::Owner;
use crate::sandboxes::forward::forward;
use crate::sandboxes::recordings::{self, NewRecording};
use crate::sandboxes::terminals::{self, TerminalEvent, TicketGrant};
use crate::state::AppState;
use crate::workers::client::{SandboxCall, TerminalCall};

/// Largest WebSocket message accepted from a client (input or control).
const MAX_MESSAGE: usize = 64 * 1024;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(open_terminal, list_terminals))
        .routes(routes!(get_terminal, close_terminal))
        .routes(routes!(terminal_input))
        .routes(routes!(terminal_resize))
        .routes(routes!(terminal_output))
        .routes(routes!(attach_ticket))
        .routes(routes!(attach))
}

/// Open a terminal session: the command (a shell by default) on a pseudo-terminal of its
/// own. It lives until its command exits, it is closed, its sandbox goes, or nobody attached
/// to it and typed into it for `idle_timeout_secs`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    request_body = OpenTerminalRequest,
    responses(
        (status = 201, description = "Opened", body = Terminal),
        (status = 404, description = "Not in the caller's team (`not_found`), or no such directory or program in the sandbox (`path_not_found`)", body = ErrorBody),
        (status = 409, description = "Not running (`sandbox_not_running`), paused (`sandbox_paused`), or a recorded session past the team's recording quota (`recording_quota_reached`)", body = ErrorBody),
        (status = 422, description = "A bad size, command or directory", body = ErrorBody),
        (status = 429, description = "The sandbox has four sessions open already (`too_many_terminals`), or rate limited (`rate_limited`)", body = ErrorBody),
    ))]
async fn open_terminal(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(request): ApiJson<OpenTerminalRequest>,
) -> ApiResult<Response> {
    let audit = context.action("sandbox.session.open");
    principal.require(Role::Member)?;
    check_terminal(&request)?;
    let mut request = request;
    // Members' keystrokes are kept out of recordings unless the session or the team asks
    // for them.
    let record_input = match request.record_input {
        Some(asked) => asked,
        None if principal.role.at_least(Role::Admin) => true,
        None if request.record => {
            crate::teams::settings(&state.db, principal.team_id)
                .await?
                .record_members_input
        }
        None => false,
    };
    request.record_input = Some(record_input);
    // A recorded session's row comes first, so the worker's chunks have a place.
    let recording = if request.record {
        recordings::check_quota(&state, principal.team_id).await?;
        Some(
            recordings::create(
                &state,
                NewRecording {
                    owner: Owner::of(&principal),
                    sandbox_id: id,
                    command: request.cmd.as_deref().unwrap_or_default(),
                    with_input: record_input,
                },
            )
            .await?,
        )
    } else {
        None
    };
    request.recording = recording;
    let opened = open_on_worker(&state, principal.team_id, id, request).await;
    if let Some(recording) = recording {
        let session = opened.as_ref().ok().map(|opened| opened.session_id);
        recordings::opened(&state, recording, session).await?;
    }
    let opened = opened?;
    let mut transaction = state.db.begin().await?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("sandbox:{id}")),
            serde_json::json!({
                "session": opened.session_id,
                "command": opened.command,
                "recording": recording,
            }),
        )
        .await?;
    transaction.commit().await?;
    Ok((StatusCode::CREATED, axum::Json(opened)).into_response())
}

/// What the gateway can check of a terminal before anything is written: its command's
/// arguments (no NUL: a recording keeps them as JSON text), environment and directory.
/// The longest a terminal may stay open with nobody attached and nothing typed: a day.
const MAX_IDLE_TIMEOUT_SECS: u64 = 86_400;

fn check_terminal(request: &OpenTerminalRequest) -> ApiResult<()> {
    if let Some(cmd) = &request.cmd
        && cmd.iter().any(|argument| argument.contains('\0'))
    {
        return Err(ApiError::InvalidRequest(
            "command arguments cannot contain NUL bytes".to_owned(),
        ));
    }
    crate::sandboxes::validate::validate_env(&request.env)?;
    if let Some(idle) = request.idle_timeout_secs
        && !(1..=MAX_IDLE_TIMEOUT_SECS).contains(&idle)
    {
        return Err(ApiError::InvalidRequest(format!(
            "`idle_timeout_secs`: from 1 to {MAX_IDLE_TIMEOUT_SECS}"
        )));
    }
    if let Some(cwd) = &request.cwd {
        crate::sandboxes::validate::validate_absolute("cwd", cwd)?;
    }
    Ok(())
}

async fn open_on_worker(
    state: &AppState,
    team: Uuid,
    id: Uuid,
    request: OpenTerminalRequest,
) -> ApiResult<Terminal> {
    let answer = forward(
        state,
        team,
        id,
        SandboxCall::Terminal(TerminalCall::Open(request)),
    )
    .await?;
    answer
        .into_response()
        .json()
        .await
        .map_err(|error| ApiError::Internal(error.into()))
}

/// The sandbox's terminal sessions.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses((status = 200, description = "OK", body = TerminalList), (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn list_terminals(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Response> {
    let answer = forward(
        &state,
        principal.team_id,
        id,
        SandboxCall::Terminal(TerminalCall::List),
    )
    .await?;
    Ok(worker_answer(answer))
}

/// One terminal session (its exit code once its command exited).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty/{sid}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("sid" = u32, Path, description = "Session id")),
    responses((status = 200, description = "OK", body = Terminal), (status = 404, description = "No such session (`terminal_not_found`)", body = ErrorBody)))]
async fn get_terminal(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, session)): ApiPath<(Uuid, u32)>,
) -> ApiResult<Response> {
    let call = SandboxCall::Terminal(TerminalCall::Get { session });
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}

/// Close a terminal session: its process group is hung up, then killed if it is still
/// there two seconds later (audited as `sandbox.session.kill`; its end, as for every
/// session, as `sandbox.session.close` with the recording).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/pty/{sid}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("sid" = u32, Path, description = "Session id")),
    responses((status = 204, description = "Closed"), (status = 404, description = "No such session (`terminal_not_found`)", body = ErrorBody)))]
async fn close_terminal(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath((id, session)): ApiPath<(Uuid, u32)>,
) -> ApiResult<StatusCode> {
    let audit = context.action("sandbox.session.kill");
    principal.require(Role::Member)?;
    let call = SandboxCall::Terminal(TerminalCall::Close { session });
    forward(&state, principal.team_id, id, call).await?;
    let mut transaction = state.db.begin().await?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("sandbox:{id}")),
            serde_json::json!({ "session": session }),
        )
        .await?;
    transaction.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Type into a terminal: the body's bytes, as they are (`\u0003` is Ctrl-C).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{sid}/input", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("sid" = u32, Path, description = "Session id")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204, description = "Typed"), (status = 404, description = "No such session (`terminal_not_found`)", body = ErrorBody)))]
async fn terminal_input(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, session)): ApiPath<(Uuid, u32)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    principal.require(Role::Member)?;
    input(&state, principal.team_id, id, session, body).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn input(state: &AppState, team: Uuid, id: Uuid, session: u32, body: Bytes) -> ApiResult<()> {
    let call = SandboxCall::Terminal(TerminalCall::Input {
        session,
        body: body.into(),
    });
    forward(state, team, id, call).await.map(drop)
}

/// Resize a terminal (its program gets `SIGWINCH`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{sid}/resize", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("sid" = u32, Path, description = "Session id")),
    request_body = ResizeRequest,
    responses((status = 204, description = "Resized"), (status = 404, description = "No such sandbox or session in the caller's team", body = ErrorBody), (status = 409, description = "Not running or paused", body = ErrorBody), (status = 422, description = "A size outside 1 to 1000", body = ErrorBody)))]
async fn terminal_resize(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, session)): ApiPath<(Uuid, u32)>,
    ApiJson(size): ApiJson<ResizeRequest>,
) -> ApiResult<StatusCode> {
    principal.require(Role::Member)?;
    let call = SandboxCall::Terminal(TerminalCall::Resize { session, size });
    forward(&state, principal.team_id, id, call).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct OutputQuery {
    /// Offset to start from (bytes since the session's first); output older than the last
    /// MiB is no longer kept, and the answer then starts later (see `x-sandbase-offset`).
    #[serde(default)]
    since: u64,
}

/// A terminal's output from `since`, streamed as it comes until the session ends (for
/// clients without WebSockets). `x-sandbase-offset` says where it starts.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty/{sid}/output", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("sid" = u32, Path, description = "Session id"), OutputQuery),
    responses((status = 200, description = "The terminal's bytes", content_type = "application/octet-stream"), (status = 404, description = "No such session (`terminal_not_found`)", body = ErrorBody)))]
async fn terminal_output(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, session)): ApiPath<(Uuid, u32)>,
    ApiQuery(query): ApiQuery<OutputQuery>,
) -> ApiResult<Response> {
    let call = SandboxCall::Terminal(TerminalCall::Output {
        session,
        since: query.since,
    });
    let answer = forward(&state, principal.team_id, id, call).await?;
    let offset = answer.header("x-sandbase-offset").map(<[u8]>::to_vec);
    let bytes =
        terminals::decode(answer.into_response().bytes_stream()).filter_map(|event| async {
            match event {
                Ok(TerminalEvent::Output(bytes)) => Some(Ok(bytes)),
                Ok(_) => None,
                Err(error) => Some(Err(std::io::Error::other(format!("{error:#}")))),
            }
        });
    let mut response = Body::from_stream(bytes).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(offset) = offset.and_then(|offset| HeaderValue::from_bytes(&offset).ok()) {
        response
            .headers_mut()
            .insert(HeaderName::from_static("x-sandbase-offset"), offset);
    }
    Ok(response)
}

/// A single-use ticket to attach to this session from a browser (`?ticket=`), valid for 30
/// seconds.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{sid}/ticket", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("sid" = u32, Path, description = "Session id")),
    responses((status = 201, description = "Issued", body = AttachTicket), (status = 404, description = "No such session (`terminal_not_found`)", body = ErrorBody)))]
async fn attach_ticket(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, session)): ApiPath<(Uuid, u32)>,
) -> ApiResult<(StatusCode, axum::Json<AttachTicket>)> {
    principal.require(Role::Member)?;
    // Only for a session that exists, in a sandbox of the caller's team.
    forward(
        &state,
        principal.team_id,
        id,
        SandboxCall::Terminal(TerminalCall::Get { session }),
    )
    .await?;
    let grant = TicketGrant {
        team_id: principal.team_id,
        sandbox: id,
        session,
    };
    let ticket = terminals::issue_ticket(&state, &grant).await?;
    let expires_at = chrono::Utc::now() + chrono::Duration::seconds(terminals::TICKET_SECS as i64);
    Ok((
        StatusCode::CREATED,
        axum::Json(AttachTicket { ticket, expires_at }),
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct AttachQuery {
    /// Offset to start from (see `/output`).
    #[serde(default)]
    since: u64,
    /// A ticket from `POST …/ticket`, instead of an `Authorization` header.
    #[serde(default)]
    #[allow(dead_code)] // read by the `TerminalCaller` extractor
    ticket: Option<String>,
}

/// Attach to a terminal over a WebSocket: binary messages are its bytes (output out, input
/// in); text messages are JSON: `{"type":"resize","cols":…,"rows":…}` in, and
/// `{"type":"attached","offset":…}`, `{"type":"lag","offset":…}` and
/// `{"type":"exit","code":…}` out. Authenticated by `Authorization` or a `ticket`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty/{sid}/attach", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("sid" = u32, Path, description = "Session id"), AttachQuery),
    responses((status = 101, description = "Attached (WebSocket)"), (status = 401, description = "A bad ticket (`invalid_ticket`)", body = ErrorBody), (status = 404, description = "No such session (`terminal_not_found`)", body = ErrorBody), (status = 426, description = "Not a WebSocket handshake (`websocket_required`)", body = ErrorBody)))]
async fn attach(
    State(state): State<AppState>,
    caller: TerminalCaller,
    ApiPath((id, session)): ApiPath<(Uuid, u32)>,
    ApiQuery(query): ApiQuery<AttachQuery>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let upgrade =
        upgrade.map_err(|rejection| ApiError::WebSocketRequired(rejection.body_text()))?;
    if let Some(grant) = &caller.ticket
        && (grant.sandbox != id || grant.session != session)
    {
        return Err(ApiError::InvalidTicket);
    }
    let call = SandboxCall::Terminal(TerminalCall::Output {
        session,
        since: query.since,
    });
    // Opened before the upgrade, so a missing session is an HTTP answer.
    let answer = forward(&state, caller.team_id, id, call).await?;
    let offset = answer
        .header("x-sandbase-offset")
        .and_then(|value| std::str::from_utf8(value).ok()?.parse::<u64>().ok())
        .unwrap_or(query.since);
    let output = answer.into_response();
    let team = caller.team_id;
    Ok(upgrade
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_upgrade(move |socket| relay(state, team, id, session, offset, output, socket)))
}

/// Output to the socket and input from it, until the session ends or the client leaves.
async fn relay(
    state: AppState,
    team: Uuid,
    id: Uuid,
    session: u32,
    offset: u64,
    output: reqwest::Response,
    socket: WebSocket,
) {
    let (mut sink, mut source) = socket.split();
    let sending = tokio::spawn(async move {
        let attached = serde_json::json!({ "type": "attached", "offset": offset });
        if sink
            .send(Message::Text(attached.to_string().into()))
            .await
            .is_err()
        {
            return;
        }
        let mut events = Box::pin(terminals::decode(output.bytes_stream()));
        while let Some(Ok(event)) = events.next().await {
            let message = match event {
                TerminalEvent::Output(bytes) => Message::Binary(bytes),
                TerminalEvent::Lag(offset) => Message::Text(
                    serde_json::json!({ "type": "lag", "offset": offset })
                        .to_string()
                        .into(),
                ),
                TerminalEvent::Exit(code) => Message::Text(
                    serde_json::json!({ "type": "exit", "code": code })
                        .to_string()
                        .into(),
                ),
            };
            if sink.send(message).await.is_err() {
                return;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    });
    while let Some(Ok(message)) = source.next().await {
        let done = match message {
            Message::Binary(bytes) => input(&state, team, id, session, bytes).await.is_err(),
            Message::Text(text) => {
                control(&state, team, id, session, text.as_str()).await;
                false
            }
            Message::Close(_) => true,
            Message::Ping(_) | Message::Pong(_) => false,
        };
        if done || sending.is_finished() {
            break;
        }
    }
    sending.abort();
}

/// A client's text message: a resize (anything else, or a size out of range, is ignored).
async fn control(state: &AppState, team: Uuid, id: Uuid, session: u32, text: &str) {
    #[derive(Deserialize)]
    struct Control {
        #[serde(rename = "type")]
        kind: String,
        cols: Option<u16>,
        rows: Option<u16>,
    }
    let Ok(control) = serde_json::from_str::<Control>(text) else {
        return;
    };
    if let ("resize", Some(cols), Some(rows)) = (control.kind.as_str(), control.cols, control.rows)
    {
        let size = ResizeRequest { cols, rows };
        let call = SandboxCall::Terminal(TerminalCall::Resize { session, size });
        if let Err(error) = forward(state, team, id, call).await {
            tracing::debug!(error = %error, "a resize from a terminal client was refused");
        }
    }
}
