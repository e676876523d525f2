//! Runs of the caller's team: submit (queued until a worker has room), read, and download
//! artifacts.

use axum::Json;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures_util::StreamExt;
use sandbase_api::runs::{CreateRunRequest, Run, RunList};
use sandbase_api::{ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath};
use crate::runs::{RUN_COLUMNS, RunRow, inputs_archive};
use crate::sandboxes::{self, Owner};
use crate::state::AppState;

const DEFAULT_COMMAND_TIMEOUT_SECS: u64 = 300;
const MAX_COMMAND_TIMEOUT_SECS: u64 = 24 * 3600;

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
        (status = 413, description = "Inputs larger than `runs.input_limit_bytes`", body = ErrorBody),
        (status = 422, description = "Invalid field", body = ErrorBody),
    ))]
async fn create_run(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(mut request): ApiJson<CreateRunRequest>,
) -> ApiResult<(StatusCode, Json<Run>)> {
    principal.require(Role::Member)?;
    if request.egress.is_none() {
        request.egress = sandboxes::team_default_egress(&state, principal.team_id).await?;
    }
    let argv = sandboxes::command_argv(request.cmd, request.command)?;
    let settings = &state.settings.sandboxes;
    let template = request
        .template
        .unwrap_or_else(|| settings.default_template.clone());
    // The same checks as a sandbox's.
    let placement = sandboxes::validate_create(
        sandbase_api::sandboxes::CreateSandboxRequest {
            template: Some(template),
            env: request.env,
            cwd: None,
            timeout_secs: None,
            resources: request.resources,
            metadata: Default::default(),
            mounts: Vec::new(),
            max_credits: None,
            egress: request.egress,
            credentials: request.credentials,
        },
        settings,
    )?;
    // Named credentials must exist now (their values are read when the run starts).
    crate::routes::secrets::ensure_exist(&state, principal.team_id, &placement.credentials).await?;
    let timeout_secs = request.timeout_secs.unwrap_or(DEFAULT_COMMAND_TIMEOUT_SECS);
    if timeout_secs == 0 || timeout_secs > MAX_COMMAND_TIMEOUT_SECS {
        return Err(ApiError::InvalidRequest(format!(
            "`timeout_secs` must be between 1 and {MAX_COMMAND_TIMEOUT_SECS}"
        )));
    }
    let outputs = request.outputs.unwrap_or_else(|| "/work/out".to_owned());
    sandboxes::validate_absolute("outputs", &outputs)?;
    if outputs == "/work/in" || outputs.starts_with("/work/in/") {
        return Err(ApiError::InvalidRequest(
            "`outputs` cannot be inside the read-only /work/in".to_owned(),
        ));
    }
    let tar = match &request.inputs.tar_base64 {
        Some(encoded) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|error| {
                    ApiError::InvalidRequest(format!("`inputs.tar_base64` is not base64: {error}"))
                })?,
        ),
        None => None,
    };
    let inputs = inputs_archive(&request.inputs.files, tar)?;
    // Workers must exist and have the template (capacity may come later).
    state.workers.candidates(&placement.template).await?;

    let id = Uuid::now_v7();
    let owner = Owner::of(&principal);
    if let Some(inputs) = &inputs {
        state
            .artifacts
            .put(&state.artifacts.inputs(owner.team_id, id), inputs.clone())
            .await?;
    }
    let resources = placement.resources;
    let mut transaction = state.db.begin().await?;
    let row: RunRow = sqlx::query_as(&format!(
        "INSERT INTO runs (id, team_id, api_key_id, user_id, template, argv, env, outputs, timeout_secs, \
           cpu_millis, memory_mb, disk_mb, pids, has_inputs, egress, credentials, state) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, 'queued') \
         RETURNING {RUN_COLUMNS}"
    ))
    .bind(id)
    .bind(owner.team_id)
    .bind(owner.api_key_id)
    .bind(owner.user_id)
    .bind(&placement.template)
    .bind(sqlx::types::Json(&argv))
    .bind(sqlx::types::Json(&placement.env))
    .bind(&outputs)
    .bind(timeout_secs as i32)
    .bind(resources.cpu_millis as i32)
    .bind(resources.memory_mb as i32)
    .bind(resources.disk_mb as i32)
    .bind(resources.pids as i32)
    .bind(inputs.is_some())
    .bind(placement.egress.as_ref().map(sqlx::types::Json))
    .bind(&placement.credentials)
    .fetch_one(&mut *transaction)
    .await?;
    context
        .record(
            &mut transaction,
            &principal,
            Some(format!("run:{id}")),
            serde_json::json!({ "template": placement.template, "inputs_bytes": inputs.as_ref().map(Vec::len) }),
        )
        .await?;
    transaction.commit().await?;
    if let Err(error) = state.run_queue.push(owner.team_id, id, false).await {
        // PostgreSQL has it: the dispatcher's sweep queues it again.
        tracing::warn!(%id, error = %error, "queueing a run in Redis failed");
    }
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
    ))]
async fn run_artifacts(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Response> {
    let row = fetch(&state, principal.team_id, id).await?;
    if matches!(row.state.as_str(), "queued" | "running") {
        return Err(ApiError::problem(
            StatusCode::CONFLICT,
            "run_not_finished",
            format!("the run is {}", row.state),
        ));
    }
    let Some((length, stream)) = state
        .artifacts
        .get(&state.artifacts.artifact(principal.team_id, id))
        .await?
    else {
        return Err(ApiError::problem(
            StatusCode::NOT_FOUND,
            "no_artifact",
            "this run left no artifact (its outputs directory was missing)",
        ));
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
