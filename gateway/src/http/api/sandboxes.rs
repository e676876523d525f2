//! Sandboxes of the caller's team: lifecycle, commands, background processes, files and
//! archives. Data-plane calls are passed to the sandbox's worker and streamed back.

use std::collections::HashMap;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use sandbase_api::sandboxes::{
    CreateSandboxRequest, DirectoryListing, ExtendTimeoutRequest, FileInfo, Process, ProcessList,
    Sandbox, SandboxList, SignalRequest, signal_number,
};
use sandbase_api::{ErrorBody, Role};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::{RequestContext, Requester};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::worker_answer::worker_answer;
use crate::sandboxes::forward::forward;
use crate::sandboxes::lifecycle::{self, Destroyed};
use crate::sandboxes::{Owner, SandboxRow, row, teardown, validate};
use crate::state::AppState;
use crate::workers::client::SandboxCall;

const MAX_LIST: i64 = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_sandbox, list_sandboxes))
        .routes(routes!(get_sandbox, destroy_sandbox))
        .routes(routes!(extend_timeout))
        .routes(routes!(list_processes))
        .routes(routes!(get_process))
        .routes(routes!(process_stdin))
        .routes(routes!(process_signal))
        .routes(routes!(read_path, write_file, remove_path))
        .routes(routes!(archive_out, archive_in))
}

/// Create a sandbox (from the template's warm pool when it has one).
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", security(("bearer" = [])),
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "Created and running", body = Sandbox),
        (status = 402, description = "The team's credits (or the key's cap) do not cover the sandbox's first minute (`insufficient_credits`)", body = ErrorBody),
        (status = 404, description = "No such snapshot in the caller's team (`snapshot` given)", body = ErrorBody),
        (status = 422, description = "Invalid field, or no worker has the template (`template_not_found`)", body = ErrorBody),
        (status = 429, description = "The team holds its quota of sandboxes (`sandbox_quota_reached`)", body = ErrorBody),
        (status = 503, description = "No worker (`no_workers`) or no room (`no_capacity`)", body = ErrorBody),
    ))]
async fn create_sandbox(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(request): ApiJson<CreateSandboxRequest>,
) -> ApiResult<(StatusCode, Json<Sandbox>)> {
    let audit = context.action("sandbox.create");
    principal.require(Role::Member)?;
    let requester = Requester::member(&audit, &principal);
    let created =
        crate::sandboxes::create::create(&state, Owner::of(&principal), requester, request).await?;
    Ok((StatusCode::CREATED, Json(created.row.to_api())))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// `creating`, `running`, `paused` or `stopped`.
    #[param(pattern = "^(creating|running|paused|stopped)$")]
    state: Option<String>,
    /// Most sandboxes returned, newest first (1 to 500, default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
    /// Filter on metadata: `metadata.KEY=VALUE`, repeatable (all must match).
    #[serde(flatten)]
    #[param(ignore)]
    rest: HashMap<String, String>,
}

/// The team's sandboxes, newest first.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", security(("bearer" = [])),
    params(ListQuery),
    responses((status = 200, description = "OK", body = SandboxList), (status = 422, description = "Invalid filter", body = ErrorBody)))]
async fn list_sandboxes(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> ApiResult<Json<SandboxList>> {
    let state_filter = match &query.state {
        Some(value) => Some(
            value
                .parse::<crate::sandboxes::SandboxState>()
                .map_err(ApiError::InvalidRequest)?,
        ),
        None => None,
    };
    let limit = query.limit.unwrap_or(100);
    if !(1..=MAX_LIST).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!(
            "`limit` must be between 1 and {MAX_LIST}"
        )));
    }
    let mut metadata = serde_json::Map::new();
    for (key, value) in &query.rest {
        let Some(name) = key.strip_prefix("metadata.") else {
            return Err(ApiError::InvalidRequest(format!(
                "unknown query parameter `{key}`"
            )));
        };
        metadata.insert(name.to_owned(), serde_json::Value::String(value.clone()));
    }
    let rows = row::list(&state.db, principal.team_id, state_filter, &metadata, limit).await?;
    Ok(Json(SandboxList {
        sandboxes: rows.iter().map(SandboxRow::to_api).collect(),
    }))
}

async fn fetch(state: &AppState, team_id: Uuid, id: Uuid) -> ApiResult<SandboxRow> {
    row::fetch(&state.db, team_id, id)
        .await?
        .ok_or(ApiError::NotFound("sandbox"))
}

/// One sandbox of the team.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses((status = 200, description = "OK", body = Sandbox), (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn get_sandbox(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<Sandbox>> {
    Ok(Json(fetch(&state, principal.team_id, id).await?.to_api()))
}

/// Destroy a sandbox: its processes, files and container are gone when this returns.
/// Destroying a stopped sandbox again is not an error.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses((status = 204, description = "Destroyed"), (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn destroy_sandbox(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    let audit = context.action("sandbox.destroy");
    principal.require(Role::Member)?;
    let mut transaction = state.db.begin().await?;
    let worker_id = match lifecycle::destroy(&mut transaction, principal.team_id, id).await? {
        Destroyed::NotFound => return Err(ApiError::NotFound("sandbox")),
        Destroyed::AlreadyStopped => return Ok(StatusCode::NO_CONTENT),
        Destroyed::Stopped { worker_id } => worker_id,
    };
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("sandbox:{id}")),
            serde_json::json!({}),
        )
        .await?;
    transaction.commit().await?;
    state.sandboxes.routes.forget(id);
    if let Some(worker_id) = worker_id {
        teardown::remove_on_worker(&state, &worker_id, id).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Set a running sandbox's remaining lifetime to `timeout_secs` from now.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    request_body = ExtendTimeoutRequest,
    responses(
        (status = 200, description = "New expiry", body = Sandbox),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "Not running (`sandbox_not_running`)", body = ErrorBody),
    ))]
async fn extend_timeout(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(request): ApiJson<ExtendTimeoutRequest>,
) -> ApiResult<Json<Sandbox>> {
    let audit = context.action("sandbox.extend");
    principal.require(Role::Member)?;
    let timeout =
        validate::validate_timeout(Some(request.timeout_secs), &state.settings.sandboxes)?;
    let mut transaction = state.db.begin().await?;
    let row = lifecycle::extend(&mut transaction, principal.team_id, id, timeout).await?;
    let Some(row) = row else {
        let existing = fetch(&state, principal.team_id, id).await?;
        return Err(ApiError::SandboxNotRunning(format!(
            "the sandbox is {}",
            existing.state
        )));
    };
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("sandbox:{id}")),
            serde_json::json!({ "timeout_secs": timeout }),
        )
        .await?;
    transaction.commit().await?;
    Ok(Json(row.to_api()))
}

/// Background processes of the sandbox (without their output).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses((status = 200, description = "OK", body = ProcessList), (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn list_processes(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Response> {
    let answer = forward(&state, principal.team_id, id, SandboxCall::Processes).await?;
    Ok(worker_answer(answer))
}

/// A background process with its output so far (the last megabyte of each stream).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Process id")),
    responses((status = 200, description = "OK", body = Process), (status = 404, description = "No such sandbox or process", body = ErrorBody)))]
async fn get_process(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, pid)): ApiPath<(Uuid, u32)>,
) -> ApiResult<Response> {
    let answer = forward(&state, principal.team_id, id, SandboxCall::Process { pid }).await?;
    Ok(worker_answer(answer))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct StdinQuery {
    /// Close standard input after these bytes.
    #[serde(default)]
    close: bool,
}

/// Write the body (raw bytes) to a background process's standard input.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Process id"), StdinQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204, description = "Written"), (status = 404, description = "No such sandbox or process", body = ErrorBody), (status = 409, description = "The process's standard input is closed (`stdin_closed`), or the sandbox is not running (`sandbox_not_running`) or paused (`sandbox_paused`)", body = ErrorBody)))]
async fn process_stdin(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath((id, pid)): ApiPath<(Uuid, u32)>,
    ApiQuery(query): ApiQuery<StdinQuery>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    context.action("sandbox.process.stdin");
    principal.require(Role::Member)?;
    let call = SandboxCall::ProcessStdin {
        pid,
        close: query.close,
        body: body.into(),
    };
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}

/// Send a signal to a background process (and the processes it started).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Process id")),
    request_body = SignalRequest,
    responses((status = 204, description = "Sent"), (status = 404, description = "No such sandbox or process", body = ErrorBody), (status = 409, description = "The process has exited (`process_exited`), or the sandbox is not running (`sandbox_not_running`) or paused (`sandbox_paused`)", body = ErrorBody), (status = 422, description = "Unknown signal", body = ErrorBody)))]
async fn process_signal(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath((id, pid)): ApiPath<(Uuid, u32)>,
    ApiJson(request): ApiJson<SignalRequest>,
) -> ApiResult<Response> {
    context.action("sandbox.process.signal");
    principal.require(Role::Member)?;
    let signal = signal_number(&request.signal).ok_or_else(|| {
        ApiError::InvalidRequest(
            "`signal`: a number from 1 to 64 or a name such as TERM, KILL, INT, HUP".to_owned(),
        )
    })?;
    let call = SandboxCall::ProcessSignal { pid, signal };
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct PathQuery {
    /// A path in the sandbox; relative paths are under `/work`.
    #[param(min_length = 1, pattern = "^[^\\u0000]+$")]
    path: String,
    /// For `DELETE` of a directory: remove its contents too.
    #[serde(default)]
    recursive: bool,
}

/// A file's bytes, or a directory's entries as JSON. Paths are resolved inside the
/// sandbox, so a link there leads to the sandbox's own file, never the host's.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 200, description = "The file (`application/octet-stream`) or the directory listing", content(
            (Vec<u8> = "application/octet-stream"),
            (DirectoryListing = "application/json"),
        )),
        (status = 404, description = "No such sandbox (`not_found`) or path (`path_not_found`)", body = ErrorBody),
    ))]
async fn read_path(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    let call = SandboxCall::ReadPath { path: query.path };
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}

/// The request body as an upload stream, refused beyond `limit` bytes.
fn upload_body(headers: &HeaderMap, body: Body, limit: u64) -> ApiResult<reqwest::Body> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(ApiError::PayloadTooLarge);
    }
    let mut seen = 0u64;
    let stream = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        seen += chunk.len() as u64;
        if seen > limit {
            return Err(std::io::Error::other(
                "the upload is larger than this server accepts",
            ));
        }
        Ok(chunk)
    });
    Ok(reqwest::Body::wrap_stream(stream))
}

/// Write a file (raw body; parents created; owned by the sandbox user). The file is
/// replaced only once the whole upload has arrived.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), PathQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Written", body = FileInfo),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 413, description = "Larger than `sandboxes.upload_limit_bytes`", body = ErrorBody),
    ))]
async fn write_file(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(query): ApiQuery<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    context.action("sandbox.file.write");
    principal.require(Role::Member)?;
    let body = upload_body(&headers, body, state.settings.sandboxes.upload_limit_bytes)?;
    let call = SandboxCall::WriteFile {
        path: query.path,
        body,
    };
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}

/// Remove a file, a link, or a directory (`recursive=true` for one that is not empty).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), PathQuery),
    responses((status = 204, description = "Removed"), (status = 404, description = "No such sandbox or path", body = ErrorBody)))]
async fn remove_path(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    context.action("sandbox.file.remove");
    principal.require(Role::Member)?;
    let call = SandboxCall::RemovePath {
        path: query.path,
        recursive: query.recursive,
    };
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}

/// A directory as a tar archive (links archived as links).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/archive", tag = "files", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 200, description = "The archive", content_type = "application/x-tar", body = Vec<u8>),
        (status = 404, description = "No such sandbox or directory", body = ErrorBody),
    ))]
async fn archive_out(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    let call = SandboxCall::ArchiveOut { path: query.path };
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}

/// Unpack a tar archive (the body) into a directory, owned by the sandbox user. Entries
/// that would land outside the directory are refused.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/archive", tag = "files", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), PathQuery),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses(
        (status = 200, description = "Unpacked", body = FileInfo),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 413, description = "Larger than `sandboxes.upload_limit_bytes`", body = ErrorBody),
        (status = 422, description = "An empty body, not a valid archive, or an entry leaves the directory (`invalid_request`)", body = ErrorBody),
    ))]
async fn archive_in(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(query): ApiQuery<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    context.action("sandbox.archive.write");
    principal.require(Role::Member)?;
    // An empty body is no archive (found by the fuzzer: it made the directory and answered
    // 200). A body without a length or a chunked encoding is empty.
    let length = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok());
    let chunked = headers.contains_key(axum::http::header::TRANSFER_ENCODING);
    if length == Some("0") || (length.is_none() && !chunked) {
        return Err(ApiError::InvalidRequest(
            "the body is empty: a tar archive is expected".to_owned(),
        ));
    }
    let body = upload_body(&headers, body, state.settings.sandboxes.upload_limit_bytes)?;
    let call = SandboxCall::ArchiveIn {
        path: query.path,
        body,
    };
    Ok(worker_answer(
        forward(&state, principal.team_id, id, call).await?,
    ))
}
