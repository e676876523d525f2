//! A sandbox's egress: its policy (read, and changed at run time — effective for new
//! connections) and its flow log (kept by its worker's proxy); and the team's default
//! policy, which sandboxes and runs that say nothing about `egress` get.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use sandbase_api::sandboxes::{EgressFlowList, EgressPolicy};
use sandbase_api::{ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::{Audit, RequestContext};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::worker_answer::worker_answer;
use crate::sandboxes::forward::forward;
use crate::sandboxes::{SandboxState, validate};
use crate::state::AppState;
use crate::workers::client::SandboxCall;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_policy, set_policy))
        .routes(routes!(flows))
        .routes(routes!(
            get_team_default,
            set_team_default,
            clear_team_default
        ))
}

/// The team's default egress policy (`null` when it has none: sandboxes and runs that give
/// no `egress` then keep loopback only).
#[utoipa::path(get, path = "/v1/egress-policy", tag = "sandboxes", security(("bearer" = [])),
    responses(
        (status = 200, description = "OK", body = Option<EgressPolicy>),
    ))]
async fn get_team_default(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<Option<EgressPolicy>>> {
    Ok(Json(
        crate::teams::default_egress(&state.db, principal.team_id).await?,
    ))
}

/// Set the team's default egress policy (admins): sandboxes and runs created without
/// `egress` get it; those created before keep theirs.
#[utoipa::path(put, path = "/v1/egress-policy", tag = "sandboxes", security(("bearer" = [])),
    request_body = EgressPolicy,
    responses(
        (status = 200, description = "Set", body = EgressPolicy),
        (status = 403, description = "Not an admin", body = ErrorBody),
        (status = 422, description = "Invalid pattern", body = ErrorBody),
    ))]
async fn set_team_default(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(policy): ApiJson<EgressPolicy>,
) -> ApiResult<Json<EgressPolicy>> {
    let audit = context.action("egress_policy.set_default");
    principal.require(Role::Admin)?;
    if policy.allow.is_empty() {
        return Err(ApiError::InvalidRequest(
            "`allow`: at least one host pattern (DELETE /v1/egress-policy removes the default)"
                .to_owned(),
        ));
    }
    let policy = validate::normalize_egress(&policy)?;
    store_team_default(&state, &principal, &audit, Some(&policy)).await?;
    Ok(Json(policy))
}

/// Remove the team's default egress policy (admins): sandboxes and runs without `egress`
/// keep loopback only again.
#[utoipa::path(delete, path = "/v1/egress-policy", tag = "sandboxes", security(("bearer" = [])),
    responses(
        (status = 204, description = "Removed"),
        (status = 403, description = "Not an admin", body = ErrorBody),
    ))]
async fn clear_team_default(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
) -> ApiResult<StatusCode> {
    let audit = context.action("egress_policy.clear_default");
    principal.require(Role::Admin)?;
    store_team_default(&state, &principal, &audit, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets (or, with `None`, removes) the team's default policy, audited in the same
/// transaction.
async fn store_team_default(
    state: &AppState,
    principal: &Principal,
    audit: &Audit,
    policy: Option<&EgressPolicy>,
) -> ApiResult<()> {
    let mut transaction = state.db.begin().await?;
    sqlx::query("UPDATE teams SET default_egress = $2 WHERE id = $1")
        .bind(principal.team_id)
        .bind(policy.map(sqlx::types::Json))
        .execute(&mut *transaction)
        .await?;
    let details = match policy {
        Some(policy) => serde_json::json!({ "allow": policy.allow, "deny": policy.deny }),
        None => serde_json::json!({}),
    };
    audit
        .record(
            &mut transaction,
            principal,
            Some(format!("team:{}", principal.team_id)),
            details,
        )
        .await?;
    transaction.commit().await?;
    Ok(())
}

type PolicyRow = (Option<sqlx::types::Json<EgressPolicy>>, SandboxState);

async fn policy_row(state: &AppState, team_id: Uuid, id: Uuid) -> ApiResult<PolicyRow> {
    sqlx::query_as("SELECT egress, state FROM sandboxes WHERE id = $1 AND team_id = $2")
        .bind(id)
        .bind(team_id)
        .fetch_optional(&state.db)
        .await?
        .ok_or(ApiError::NotFound("sandbox"))
}

fn not_enabled() -> ApiError {
    ApiError::EgressNotEnabled
}

/// The sandbox's egress policy.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/egress-policy", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "OK", body = EgressPolicy),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "Created without egress (`egress_not_enabled`)", body = ErrorBody),
    ))]
async fn get_policy(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<EgressPolicy>> {
    let (policy, _) = policy_row(&state, principal.team_id, id).await?;
    policy.map(|policy| Json(policy.0)).ok_or_else(not_enabled)
}

/// Replace the sandbox's egress policy; new connections follow it at once.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/egress-policy", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    request_body = EgressPolicy,
    responses(
        (status = 200, description = "Changed", body = EgressPolicy),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "Created without egress, or not running", body = ErrorBody),
        (status = 422, description = "Invalid pattern", body = ErrorBody),
    ))]
async fn set_policy(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(policy): ApiJson<EgressPolicy>,
) -> ApiResult<Json<EgressPolicy>> {
    let audit = context.action("sandbox.egress_policy");
    principal.require(Role::Member)?;
    let (current, sandbox_state) = policy_row(&state, principal.team_id, id).await?;
    if current.is_none() {
        return Err(not_enabled());
    }
    if sandbox_state != SandboxState::Running {
        return Err(ApiError::SandboxNotRunning(
            "the sandbox is not running".to_owned(),
        ));
    }
    let policy = validate::normalize_egress(&policy)?;
    // The worker first: the database says what is in force.
    let answer = forward(
        &state,
        principal.team_id,
        id,
        SandboxCall::SetEgressPolicy(policy.clone()),
    )
    .await?;
    if answer.status() != StatusCode::NO_CONTENT {
        return Err(ApiError::Internal(anyhow::anyhow!(
            "the worker answered {} to a policy change",
            answer.status()
        )));
    }
    let mut transaction = state.db.begin().await?;
    sqlx::query("UPDATE sandboxes SET egress = $3 WHERE id = $1 AND team_id = $2")
        .bind(id)
        .bind(principal.team_id)
        .bind(sqlx::types::Json(&policy))
        .execute(&mut *transaction)
        .await?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("sandbox:{id}")),
            serde_json::json!({ "allow": policy.allow, "deny": policy.deny }),
        )
        .await?;
    transaction.commit().await?;
    Ok(Json(policy))
}

/// The sandbox's recent connections through the egress proxy (allowed, denied, failed), with
/// bytes each way. Credential values never appear here.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/egress", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "OK", body = EgressFlowList),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
    ))]
async fn flows(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Response> {
    let answer = forward(&state, principal.team_id, id, SandboxCall::EgressFlows).await?;
    Ok(worker_answer(answer))
}
