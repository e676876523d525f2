//! Commands in a sandbox: run one (whole, streamed, in the background or in a shell
//! session), and read or cancel a named one (`exec_id`). Passed to the sandbox's worker and
//! streamed back.

use axum::extract::State;
use axum::response::Response;
use sandbase_api::execs::{ExecStatus, valid_exec_id};
use sandbase_api::internal::{Exec, RecordFor};
use sandbase_api::sandboxes::{BackgroundStarted, ExecEvent, ExecRequest, ExecResult};
use sandbase_api::{ErrorBody, Role};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::worker_answer::worker_answer;
use crate::sandboxes::forward::forward;
use crate::sandboxes::validate;
use crate::state::AppState;
use crate::workers::client::SandboxCall;

/// Longest per-command timeout.
const MAX_COMMAND_TIMEOUT_SECS: u64 = 24 * 3600;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(exec))
        .routes(routes!(get_exec))
        .routes(routes!(cancel_exec))
}

/// Run a command. By default the answer is its whole result; with `"stream": true` an
/// NDJSON stream of `{"pid"}`, `{"stdout"}` / `{"stderr"}` chunks and a last `{"exit_code"}`;
/// with `"background": true` its pid at once (see `/processes`). A command that is not
/// found exits with 127, as in a shell. With an `exec_id` the command runs to its end
/// whatever happens to this connection (see `GET …/execs/{exec_id}`), and starting the
/// same `exec_id` again answers the first start's command.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "The command's result, or (with `stream`) its NDJSON events", content(
            (ExecResult = "application/json"),
            (ExecEvent = "application/x-ndjson"),
        )),
        (status = 201, description = "Started in the background", body = BackgroundStarted),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "Not running (`sandbox_not_running`), a command asking to be recorded past the team's recording quota (`recording_quota_reached`), a shell session of the other user (`session_user_mismatch`), or an `exec_id` kept for another command (`exec_id_in_use`)", body = ErrorBody),
        (status = 422, description = "Invalid command", body = ErrorBody),
        (status = 429, description = "The sandbox's background processes or named commands (`too_many_processes`) or shell sessions (`too_many_sessions`) are at their limit, or rate limited (`rate_limited`)", body = ErrorBody),
    ))]
async fn exec(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(request): ApiJson<ExecRequest>,
) -> ApiResult<Response> {
    context.action("sandbox.exec");
    principal.require(Role::Member)?;
    if let Some(session) = &request.session {
        validate::session(session, &request)?;
    }
    if let Some(exec_id) = &request.exec_id {
        validate::exec_id(exec_id, &request)?;
    }
    let argv = validate::command_argv(request.cmd, request.command)?;
    validate::validate_env(&request.env)?;
    if let Some(cwd) = &request.cwd {
        validate::validate_absolute("cwd", cwd)?;
    }
    let timeout_ms = match request.timeout_secs {
        Some(0) => {
            return Err(ApiError::InvalidRequest(
                "`timeout_secs` must be at least 1".to_owned(),
            ));
        }
        Some(seconds) if seconds > MAX_COMMAND_TIMEOUT_SECS => {
            return Err(ApiError::InvalidRequest(format!(
                "`timeout_secs` must be at most {MAX_COMMAND_TIMEOUT_SECS}"
            )));
        }
        other => other.map(|seconds| seconds * 1000),
    };
    if request.stream && request.background {
        return Err(ApiError::InvalidRequest(
            "`stream` and `background` exclude each other".to_owned(),
        ));
    }
    if request.record && !request.background {
        crate::sandboxes::recordings::check_quota(&state, principal.team_id).await?;
    }
    let exec = Exec {
        argv,
        env: request.env,
        cwd: request.cwd,
        user: request.user,
        stdin: request.stdin,
        timeout_ms,
        stream: request.stream,
        background: request.background,
        session: request.session,
        exec_id: request.exec_id,
        // Commands are recorded (background processes are not: they have no end to wait
        // for; their output is kept with them).
        record: (request.record && !request.background).then(|| {
            let owner = crate::sandboxes::Owner::of(&principal);
            RecordFor {
                api_key_id: owner.api_key_id,
                user_id: owner.user_id,
            }
        }),
    };
    let answer = forward(
        &state,
        principal.team_id,
        id,
        SandboxCall::Exec(Box::new(exec)),
    )
    .await?;
    Ok(worker_answer(answer))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ExecQuery {
    /// The byte offset in the command's output (both streams, in the order written) to
    /// read from: `next_offset` of the last read, or an event's `offset` plus its length.
    #[serde(default)]
    #[param(minimum = 0)]
    offset: u64,
    /// Follow the command as NDJSON events (output chunks with their `offset`, the exit
    /// last) until it ends, instead of one JSON answer.
    #[serde(default)]
    stream: bool,
}

/// The `exec_id` of a path, checked before it becomes part of a worker's path.
fn exec_id_of(exec_id: String) -> ApiResult<String> {
    if valid_exec_id(&exec_id) {
        Ok(exec_id)
    } else {
        Err(ApiError::InvalidRequest(
            "`exec_id`: 1 to 128 letters, digits, `.`, `_`, `:` or `-`".to_owned(),
        ))
    }
}

/// A named command (started with an `exec_id`): whether it runs, how it ended, and its
/// output from `offset` — the last MiB is kept, for 10 minutes after it ends. With
/// `stream`, NDJSON events as it runs: a reader that lost its connection goes on from the
/// `offset` it reached, missing nothing and seeing nothing twice.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/execs/{exec_id}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"),
        ("exec_id" = String, Path, description = "The command's `exec_id`", pattern = "^[A-Za-z0-9._:-]{1,128}$"),
        ExecQuery),
    responses(
        (status = 200, description = "The command and its output from `offset`, or (with `stream`) its NDJSON events", content(
            (ExecStatus = "application/json"),
            (ExecEvent = "application/x-ndjson"),
        )),
        (status = 404, description = "No such sandbox in the caller's team, or no command under this `exec_id` (`exec_not_found`)", body = ErrorBody),
    ))]
async fn get_exec(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, exec_id)): ApiPath<(Uuid, String)>,
    ApiQuery(query): ApiQuery<ExecQuery>,
) -> ApiResult<Response> {
    let call = SandboxCall::ExecStatus {
        exec_id: exec_id_of(exec_id)?,
        offset: query.offset,
        stream: query.stream,
    };
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}

/// Cancel a named command: SIGINT now, SIGKILL a second later to what is left of it. A
/// shell session's command is interrupted with the session's shell left alive, its working
/// directory and environment kept. Cancelling an ended command changes nothing. Answers
/// the command's state (without output).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/execs/{exec_id}/cancel", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"),
        ("exec_id" = String, Path, description = "The command's `exec_id`", pattern = "^[A-Za-z0-9._:-]{1,128}$")),
    responses(
        (status = 200, description = "Interrupted (or it had ended)", body = ExecStatus),
        (status = 404, description = "No such sandbox in the caller's team, or no command under this `exec_id` (`exec_not_found`)", body = ErrorBody),
    ))]
async fn cancel_exec(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath((id, exec_id)): ApiPath<(Uuid, String)>,
) -> ApiResult<Response> {
    context.action("sandbox.exec.cancel");
    principal.require(Role::Member)?;
    let call = SandboxCall::ExecCancel {
        exec_id: exec_id_of(exec_id)?,
    };
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}
