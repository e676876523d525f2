//! The code endpoint: Python run in a stateful context of a sandbox (variables and imports
//! live on between calls), its output streamed and its results rich; contexts made,
//! listed, interrupted and deleted. Passed to the sandbox's worker and streamed back.

use axum::extract::State;
use axum::response::Response;
use sandbase_api::code::{
    CodeContext, CodeContextList, CodeEvent, CodeResult, CreateCodeContextRequest, RunCodeRequest,
    valid_context_id,
};
use sandbase_api::{ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::worker_answer::worker_answer;
use crate::sandboxes::forward::forward;
use crate::sandboxes::validate;
use crate::state::AppState;
use crate::workers::client::{CodeCall, SandboxCall};

/// Longest code a call carries, in characters.
const MAX_CODE_CHARS: usize = 1 << 20;
/// Longest timeout of a call.
const MAX_TIMEOUT_SECS: u64 = 86_400;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(run_code))
        .routes(routes!(create_context, list_contexts))
        .routes(routes!(delete_context))
        .routes(routes!(interrupt_context))
}

fn context_id(id: String) -> ApiResult<String> {
    if valid_context_id(&id) {
        Ok(id)
    } else {
        Err(ApiError::InvalidRequest(
            "`context`: 1 to 64 letters, digits, `.`, `_` or `-`".to_owned(),
        ))
    }
}

async fn call(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
    call: CodeCall,
) -> ApiResult<Response> {
    let answer = forward(state, principal.team_id, id, SandboxCall::Code(call)).await?;
    Ok(worker_answer(answer))
}

/// Run Python in a context of the sandbox (`default` unless `context` names one), as the
/// context's user: its variables, imports and working directory carry over to the next
/// call. The answer is whole (stdout, stderr, every result, the last expression's value as
/// `main`, an exception) or, with `stream`, NDJSON events as they come. `display(x)` shows a
/// value; a matplotlib figure shown (or left open) comes back as `image/png`. Past
/// `timeout_secs` the code is interrupted (KeyboardInterrupt) and the context kept; the
/// call runs to its end even when the caller leaves.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/code", tag = "code", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    request_body = RunCodeRequest,
    responses(
        (status = 200, description = "The call's result, or (with `stream`) its NDJSON events", content(
            (CodeResult = "application/json"),
            (CodeEvent = "application/x-ndjson"),
        )),
        (status = 404, description = "Not in the caller's team, or no such context (`context_not_found`)", body = ErrorBody),
        (status = 409, description = "The sandbox's template has no python3 (`python_not_available`), or the sandbox is not running (`sandbox_not_running`) or paused (`sandbox_paused`)", body = ErrorBody),
        (status = 429, description = "The sandbox's code contexts are at their limit (`too_many_contexts`), or rate limited (`rate_limited`)", body = ErrorBody),
    ))]
async fn run_code(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(request): ApiJson<RunCodeRequest>,
) -> ApiResult<Response> {
    context.action("sandbox.code");
    principal.require(Role::Member)?;
    if request.code.chars().count() > MAX_CODE_CHARS || request.code.contains('\0') {
        return Err(ApiError::InvalidRequest(
            "`code`: at most 1 048 576 characters, without NUL".to_owned(),
        ));
    }
    if let Some(timeout) = request.timeout_secs
        && !(1..=MAX_TIMEOUT_SECS).contains(&timeout)
    {
        return Err(ApiError::InvalidRequest(
            "`timeout_secs`: 1 to 86400".to_owned(),
        ));
    }
    let mut request = request;
    request.context = request.context.map(context_id).transpose()?;
    call(&state, &principal, id, CodeCall::Run(request)).await
}

/// Make a code context: a Python interpreter of its own in the sandbox (at most 4), with
/// its working directory, environment and user.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts", tag = "code", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    request_body = CreateCodeContextRequest,
    responses(
        (status = 201, description = "Made", body = CodeContext),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "The sandbox's template has no python3 (`python_not_available`), or the sandbox is not running (`sandbox_not_running`) or paused (`sandbox_paused`)", body = ErrorBody),
        (status = 429, description = "The sandbox's code contexts are at their limit (`too_many_contexts`), or rate limited (`rate_limited`)", body = ErrorBody),
    ))]
async fn create_context(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(request): ApiJson<CreateCodeContextRequest>,
) -> ApiResult<Response> {
    context.action("sandbox.code.context.create");
    principal.require(Role::Member)?;
    validate::validate_env(&request.env)?;
    if let Some(cwd) = &request.cwd {
        validate::validate_absolute("cwd", cwd)?;
    }
    call(&state, &principal, id, CodeCall::CreateContext(request)).await
}

/// The sandbox's code contexts.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/code/contexts", tag = "code", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "OK", body = CodeContextList),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
    ))]
async fn list_contexts(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Response> {
    call(&state, &principal, id, CodeCall::ListContexts).await
}

/// End a code context and everything it held.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/code/contexts/{context}", tag = "code", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"),
        ("context" = String, Path, description = "Context id", pattern = "^[A-Za-z0-9._-]{1,64}$")),
    responses(
        (status = 204, description = "Ended"),
        (status = 404, description = "Not in the caller's team, or no such context (`context_not_found`)", body = ErrorBody),
    ))]
async fn delete_context(
    State(state): State<AppState>,
    principal: Principal,
    request_context: RequestContext,
    ApiPath((id, context)): ApiPath<(Uuid, String)>,
) -> ApiResult<Response> {
    request_context.action("sandbox.code.context.delete");
    principal.require(Role::Member)?;
    let context = context_id(context)?;
    call(&state, &principal, id, CodeCall::DeleteContext { context }).await
}

/// Interrupt what a context runs: KeyboardInterrupt in the code, its variables kept.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts/{context}/interrupt", tag = "code", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"),
        ("context" = String, Path, description = "Context id", pattern = "^[A-Za-z0-9._-]{1,64}$")),
    responses(
        (status = 204, description = "Interrupted"),
        (status = 404, description = "Not in the caller's team, or no such context (`context_not_found`)", body = ErrorBody),
    ))]
async fn interrupt_context(
    State(state): State<AppState>,
    principal: Principal,
    request_context: RequestContext,
    ApiPath((id, context)): ApiPath<(Uuid, String)>,
) -> ApiResult<Response> {
    request_context.action("sandbox.code.interrupt");
    principal.require(Role::Member)?;
    let context = context_id(context)?;
    call(&state, &principal, id, CodeCall::Interrupt { context }).await
}
