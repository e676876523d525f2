//! Pausing and resuming a team's sandbox: the worker freezes or thaws it first, then the
//! row says so, with its audit row, in one transaction (the row stays locked meanwhile, so
//! a destroy or another pause waits).

use axum::Json;
use axum::extract::State;
use sandbase_api::sandboxes::Sandbox;
use sandbase_api::{ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::{Audit, RequestContext};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::ApiPath;
use crate::sandboxes::SandboxState;
use crate::sandboxes::forward::not_running;
use crate::sandboxes::lifecycle;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(pause_sandbox))
        .routes(routes!(resume_sandbox))
}

/// Pause a sandbox: its processes (background ones and shell sessions included) are frozen
/// with their memory and use no CPU; commands and file calls answer 409 `sandbox_paused`
/// until it is resumed. A paused sandbox is charged for its memory only
/// (`billing.paused_gib_second_micro`); its lifetime runs on. Pausing a paused sandbox
/// changes nothing.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Paused", body = Sandbox),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "Stopped or still starting (`sandbox_not_running`)", body = ErrorBody),
    ))]
async fn pause_sandbox(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<Sandbox>> {
    let audit = context.action("sandbox.pause");
    set_paused(&state, &principal, audit, id, true).await
}

/// Resume a paused sandbox: its processes go on where they were. Resuming a running
/// sandbox changes nothing.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Running", body = Sandbox),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "Stopped or still starting (`sandbox_not_running`)", body = ErrorBody),
    ))]
async fn resume_sandbox(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<Sandbox>> {
    let audit = context.action("sandbox.resume");
    set_paused(&state, &principal, audit, id, false).await
}

async fn set_paused(
    state: &AppState,
    principal: &Principal,
    audit: Audit,
    id: Uuid,
    paused: bool,
) -> ApiResult<Json<Sandbox>> {
    principal.require(Role::Member)?;
    let mut transaction = state.db.begin().await?;
    let found = lifecycle::lock_for_pause(&mut transaction, principal.team_id, id)
        .await?
        .ok_or(ApiError::NotFound("sandbox"))?;
    let worker_id = match found {
        lifecycle::Whereabouts {
            state: SandboxState::Running | SandboxState::Paused,
            worker_id: Some(worker_id),
            ..
        } => worker_id,
        other => return Err(not_running(other.state, other.stop_reason)),
    };
    let worker = state.sandboxes.workers.address_of(&worker_id).await?;
    state
        .sandboxes
        .worker_client
        .set_paused(&worker, id, paused)
        .await?;
    let row = lifecycle::set_paused(&mut transaction, id, paused).await?;
    audit
        .record(
            &mut transaction,
            principal,
            Some(format!("sandbox:{id}")),
            serde_json::json!({}),
        )
        .await?;
    transaction.commit().await?;
    Ok(Json(row.to_api()))
}
