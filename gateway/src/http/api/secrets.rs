//! The team's credentials: set, list (metadata only), new version, remove. A value is
//! encrypted before it is written (the vault) and is never in an answer, a log line, an
//! error or an audit row.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandbase_api::secrets::{CreateSecretRequest, Secret, SecretList, UpdateSecretRequest};
use sandbase_api::{ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath};
use crate::secrets::{
    SECRET_COLUMNS, SecretRow, keyring, validate_hosts, validate_injection, validate_name,
    vault_error,
};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_secrets, create_secret))
        .routes(routes!(update_secret, delete_secret))
}

/// The team's secrets: names, hosts and injection, never values.
#[utoipa::path(get, path = "/v1/secrets", tag = "secrets", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = SecretList)))]
async fn list_secrets(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<SecretList>> {
    let rows: Vec<SecretRow> = sqlx::query_as(&format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE team_id = $1 ORDER BY name"
    ))
    .bind(principal.team_id)
    .fetch_all(&state.db)
    .await?;
    Ok(Json(SecretList {
        secrets: rows.iter().map(SecretRow::to_api).collect(),
    }))
}

/// Store a credential (admins). Its value is encrypted at once and never shown again.
#[utoipa::path(post, path = "/v1/secrets", tag = "secrets", security(("bearer" = [])),
    request_body = CreateSecretRequest,
    responses(
        (status = 201, description = "Stored", body = Secret),
        (status = 409, description = "A secret of this name exists (`secret_exists`)", body = ErrorBody),
        (status = 422, description = "Invalid field", body = ErrorBody),
        (status = 501, description = "No vault key configured (`vault_not_configured`)", body = ErrorBody),
    ))]
async fn create_secret(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(request): ApiJson<CreateSecretRequest>,
) -> ApiResult<(StatusCode, Json<Secret>)> {
    let audit = context.action("secret.create");
    principal.require(Role::Admin)?;
    let keyring = keyring(&state)?;
    let value = sandbase_vault::Zeroizing::new(request.value);
    validate_name(&request.name)?;
    let hosts = validate_hosts(&request.hosts)?;
    validate_injection(&request.inject, Some(&value))?;
    let id = Uuid::now_v7();
    let mut transaction = state.db.begin().await?;
    let inserted: Option<SecretRow> = sqlx::query_as(&format!(
        "INSERT INTO secrets (id, team_id, name, hosts, inject, version, created_by, usable_by) \
         VALUES ($1, $2, $3, $4, $5, 1, $6, $7) ON CONFLICT (team_id, name) DO NOTHING \
         RETURNING {SECRET_COLUMNS}"
    ))
    .bind(id)
    .bind(principal.team_id)
    .bind(&request.name)
    .bind(sqlx::types::Json(&hosts))
    .bind(sqlx::types::Json(&request.inject))
    .bind(principal.user_id())
    .bind(request.usable_by.as_str())
    .fetch_optional(&mut *transaction)
    .await?;
    let Some(row) = inserted else {
        return Err(ApiError::SecretExists(request.name));
    };
    sandbase_vault::seal_secret(
        &mut transaction,
        keyring,
        principal.team_id,
        id,
        1,
        value.as_bytes(),
    )
    .await
    .map_err(vault_error)?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("secret:{}", request.name)),
            serde_json::json!({ "hosts": hosts, "version": 1, "usable_by": request.usable_by }),
        )
        .await?;
    transaction.commit().await?;
    Ok((StatusCode::CREATED, Json(row.to_api())))
}

/// Set a new value (a new version), and optionally new hosts or injection (admins).
#[utoipa::path(put, path = "/v1/secrets/{name}", tag = "secrets", security(("bearer" = [])),
    params(("name" = String, Path, description = "Secret name")),
    request_body = UpdateSecretRequest,
    responses(
        (status = 200, description = "New version stored", body = Secret),
        (status = 404, description = "No such secret", body = ErrorBody),
        (status = 422, description = "Invalid field", body = ErrorBody),
        (status = 501, description = "No vault key configured (`vault_not_configured`)", body = ErrorBody),
    ))]
async fn update_secret(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<UpdateSecretRequest>,
) -> ApiResult<Json<Secret>> {
    let audit = context.action("secret.update");
    principal.require(Role::Admin)?;
    let keyring = keyring(&state)?;
    let value = sandbase_vault::Zeroizing::new(request.value);
    validate_name(&name)?;
    let mut transaction = state.db.begin().await?;
    let current: SecretRow = sqlx::query_as(&format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE team_id = $1 AND name = $2 FOR UPDATE"
    ))
    .bind(principal.team_id)
    .bind(&name)
    .fetch_optional(&mut *transaction)
    .await?
    .ok_or(ApiError::NotFound("secret"))?;
    let hosts = match &request.hosts {
        Some(hosts) => validate_hosts(hosts)?,
        None => current.hosts.0.clone(),
    };
    let inject = request.inject.unwrap_or_else(|| current.inject.0.clone());
    validate_injection(&inject, Some(&value))?;
    let usable_by = request.usable_by.unwrap_or_else(|| current.usable_by());
    let version = current.version + 1;
    let row: SecretRow = sqlx::query_as(&format!(
        "UPDATE secrets SET hosts = $2, inject = $3, version = $4, usable_by = $5, \
         updated_at = now() WHERE id = $1 RETURNING {SECRET_COLUMNS}"
    ))
    .bind(current.id)
    .bind(sqlx::types::Json(&hosts))
    .bind(sqlx::types::Json(&inject))
    .bind(version)
    .bind(usable_by.as_str())
    .fetch_one(&mut *transaction)
    .await?;
    sandbase_vault::seal_secret(
        &mut transaction,
        keyring,
        principal.team_id,
        current.id,
        version,
        value.as_bytes(),
    )
    .await
    .map_err(vault_error)?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("secret:{name}")),
            serde_json::json!({ "hosts": hosts, "version": version, "usable_by": usable_by }),
        )
        .await?;
    transaction.commit().await?;
    Ok(Json(row.to_api()))
}

/// Remove a secret and every version of its value (admins). Sandboxes already given it
/// keep it until they stop.
#[utoipa::path(delete, path = "/v1/secrets/{name}", tag = "secrets", security(("bearer" = [])),
    params(("name" = String, Path, description = "Secret name")),
    responses((status = 204, description = "Removed"), (status = 404, description = "No such secret", body = ErrorBody)))]
async fn delete_secret(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let audit = context.action("secret.delete");
    principal.require(Role::Admin)?;
    let mut transaction = state.db.begin().await?;
    let deleted = sqlx::query("DELETE FROM secrets WHERE team_id = $1 AND name = $2")
        .bind(principal.team_id)
        .bind(&name)
        .execute(&mut *transaction)
        .await?;
    if deleted.rows_affected() == 0 {
        return Err(ApiError::NotFound("secret"));
    }
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("secret:{name}")),
            serde_json::json!({}),
        )
        .await?;
    transaction.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
