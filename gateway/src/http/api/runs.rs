//! Runs of the caller's team: submit (queued until a worker has room), read, and download
//! artifacts.

use axum::Json;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandbase_api::runs::{CreateRunRequest, Run, RunList};
use sandbase_api::{ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath};
use crate::runs::{RUN_COLUMNS, RunRow, submit};
use crate::state::AppState;

pub fn router(input_limit_bytes: usize) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_run, list_runs))
        .layer(DefaultBodyLimit::max(input_limit_bytes))
        .routes(routes!(get_run))
        .routes(routes!(run_artifacts))
}

/// Submit a run: a sandbox of its own gets the inputs in `/work/in` (read-only to the
/// command), runs the command as the sandbox user, and keeps what it wrote under
/// `outputs` as the artifact. The run waits in a queue, fair between teams, while no
/// worker has room.
#[utoipa::path(post, path = "/v1/runs", tag = "runs", security(("bearer" = [])),
    request_body = CreateRunRequest,
    responses(
        (status = 202, description = "Queued", body = Run),
        (status = 402, description = "The team's credits (or the key's cap) do not cover the run's first minute (`insufficient_credits`)", body = ErrorBody),
        (status = 413, description = "Inputs larger than `runs.input_limit_bytes`", body = ErrorBody),
        (status = 422, description = "Invalid field", body = ErrorBody),
    ))]
async fn create_run(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(request): ApiJson<CreateRunRequest>,
) -> ApiResult<(StatusCode, Json<Run>)> {
    let audit = context.action("run.create");
    principal.require(Role::Member)?;
    let row = submit::submit(&state, &principal, &audit, request).await?;
    Ok((StatusCode::ACCEPTED, Json(row.to_api())))
}

/// The team's runs, newest first (the last 100).
#[utoipa::path(get, path = "/v1/runs", tag = "runs", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = RunList)))]
async fn list_runs(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<RunList>> {
    let rows: Vec<RunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE team_id = $1 ORDER BY created_at DESC, id DESC LIMIT 100"
    ))
    .bind(principal.team_id)
    .fetch_all(&state.db)
    .await?;
    Ok(Json(RunList {
        runs: rows.iter().map(RunRow::to_api).collect(),
    }))
}

async fn fetch(state: &AppState, team_id: Uuid, id: Uuid) -> ApiResult<RunRow> {
    sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE id = $1 AND team_id = $2"
    ))
    .bind(id)
    .bind(team_id)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("run"))
}

/// One run of the team.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 200, description = "OK", body = Run), (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn get_run(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<Run>> {
    Ok(Json(fetch(&state, principal.team_id, id).await?.to_api()))
}

/// What the command left under `outputs`, as a tar archive.
#[utoipa::path(get, path = "/v1/runs/{id}/artifacts", tag = "runs", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Run id")),
    responses(
        (status = 200, description = "The archive", content_type = "application/x-tar", body = Vec<u8>),
        (status = 404, description = "Not in the caller's team, or no artifact (`no_artifact`)", body = ErrorBody),
        (status = 409, description = "The run has not finished (`run_not_finished`)", body = ErrorBody),
        (status = 410, description = "Kept for `runs.artifact_retention_secs`, then deleted (`artifact_expired`)", body = ErrorBody),
    ))]
async fn run_artifacts(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Response> {
    let row = fetch(&state, principal.team_id, id).await?;
    if !row.state.is_finished() {
        return Err(ApiError::RunNotFinished(row.state.as_str()));
    }
    if row.artifact_deleted_at.is_some() {
        return Err(ApiError::ArtifactExpired);
    }
    let Some((length, stream)) = state
        .sandboxes
        .artifacts
        .get(&state.sandboxes.artifacts.artifact(principal.team_id, id))
        .await?
    else {
        return Err(ApiError::NoArtifact);
    };
    let stream = stream.map(|chunk| chunk.map_err(std::io::Error::other));
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-tar".to_owned()),
            (header::CONTENT_LENGTH, length.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}
