//! API keys: list, read, create, revoke. Every query is scoped to the caller's team.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{Duration, Utc};
use sandbase_api::{ApiKey, ApiKeyList, CreateApiKeyRequest, CreatedApiKey, ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::accounts::{self, API_KEY_COLUMNS, ApiKeyRow};
use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::auth::key_cache::Invalidation;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath};
use crate::keys;
use crate::state::AppState;

/// Longest lifetime a key may be given.
const MAX_EXPIRY_SECS: u64 = 10 * 365 * 24 * 3600;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_keys, create_key))
        .routes(routes!(get_key, revoke_key))
}

/// The team's active (not revoked) API keys. Secrets are never shown.
#[utoipa::path(get, path = "/v1/api-keys", tag = "api-keys", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = ApiKeyList), (status = 401, description = "Missing or invalid credentials", body = ErrorBody)))]
async fn list_keys(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<ApiKeyList>> {
    let rows: Vec<ApiKeyRow> = sqlx::query_as(&format!(
        "SELECT {API_KEY_COLUMNS} FROM api_keys \
         WHERE team_id = $1 AND revoked_at IS NULL ORDER BY created_at DESC, id DESC"
    ))
    .bind(principal.team_id)
    .fetch_all(&state.db)
    .await?;
    Ok(Json(ApiKeyList {
        items: rows.iter().map(ApiKeyRow::to_api).collect(),
    }))
}

/// One active API key of the team.
#[utoipa::path(get, path = "/v1/api-keys/{id}", tag = "api-keys", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "API key id")),
    responses((status = 200, description = "OK", body = ApiKey), (status = 404, description = "Not found in the caller's team (`not_found`)", body = ErrorBody)))]
async fn get_key(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<ApiKey>> {
    let row: ApiKeyRow = sqlx::query_as(&format!(
        "SELECT {API_KEY_COLUMNS} FROM api_keys WHERE id = $1 AND team_id = $2 AND revoked_at IS NULL"
    ))
    .bind(id)
    .bind(principal.team_id)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("API key"))?;
    Ok(Json(row.to_api()))
}

/// Create an API key. Its `token` is in this answer only. A key made with a key is its
/// child: at most its role, its remaining cap (the default) and its expiry (the default),
/// revoked with it, and its spending counts against the parent's cap.
#[utoipa::path(post, path = "/v1/api-keys", tag = "api-keys", security(("bearer" = [])),
    request_body = CreateApiKeyRequest,
    responses(
        (status = 201, description = "Created", body = CreatedApiKey),
        (status = 403, description = "Requested role above the caller's (`forbidden`), or a cap or expiry beyond what the key making it has (`exceeds_parent_key`)", body = ErrorBody),
        (status = 422, description = "Invalid field (`invalid_request`)", body = ErrorBody),
    ))]
async fn create_key(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(request): ApiJson<CreateApiKeyRequest>,
) -> ApiResult<(StatusCode, Json<CreatedApiKey>)> {
    let audit = context.action("api_key.create");
    let name = accounts::parse_name("name", &request.name)?;
    let role = request.role.unwrap_or(Role::Member);
    if !principal.role.at_least(role) {
        return Err(ApiError::Forbidden(format!(
            "a key with the {role} role can only be created by an {role} or above"
        )));
    }
    let now = Utc::now();
    let expires_at = match (request.expires_at, request.expires_in_secs) {
        (Some(_), Some(_)) => {
            return Err(ApiError::InvalidRequest(
                "give either `expires_at` or `expires_in_secs`, not both".to_owned(),
            ));
        }
        (Some(at), None) => Some(at),
        (None, Some(seconds)) => {
            if seconds == 0 || seconds > MAX_EXPIRY_SECS {
                return Err(ApiError::InvalidRequest(format!(
                    "`expires_in_secs` must be between 1 and {MAX_EXPIRY_SECS}"
                )));
            }
            Some(now + Duration::seconds(seconds as i64))
        }
        (None, None) => None,
    };
    if let Some(at) = expires_at {
        if at <= now {
            return Err(ApiError::InvalidRequest(
                "`expires_at` must be in the future".to_owned(),
            ));
        }
        if at > now + Duration::seconds(MAX_EXPIRY_SECS as i64) {
            return Err(ApiError::InvalidRequest(
                "`expires_at` must be at most ten years ahead".to_owned(),
            ));
        }
    }
    let max_credits =
        crate::sandboxes::validate::parse_cap("max_credits", request.max_credits.as_deref())?;
    let mut transaction = state.db.begin().await?;
    // A key made by a key is its child, bounded by it.
    let parent = keys::parent_of(&mut transaction, &principal).await?;
    let (max_credits, expires_at) = match &parent {
        Some(parent) => keys::bound_by_parent(parent, max_credits, expires_at)?,
        None => (max_credits, expires_at),
    };
    let mut created = accounts::create_api_key(
        &mut transaction,
        principal.team_id,
        &name,
        role,
        principal.user_id(),
        expires_at,
    )
    .await?;
    let lineage = parent
        .as_ref()
        .map(keys::Parent::child_lineage)
        .unwrap_or_default();
    let allowed_models = crate::store::allowed::validate(request.allowed_models)?;
    sqlx::query(
        "UPDATE api_keys SET max_credits = $2, lineage = $3, allowed_models = $4 WHERE id = $1",
    )
    .bind(created.key.id)
    .bind(max_credits)
    .bind(&lineage)
    .bind(&allowed_models)
    .execute(&mut *transaction)
    .await?;
    created.key.max_credits_micro = max_credits;
    created.key.allowed_models = allowed_models;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("api_key:{}", created.key.id)),
            serde_json::json!({ "public_id": created.key.public_id, "name": name, "role": role, "max_credits_micro": max_credits }),
        )
        .await?;
    transaction.commit().await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Revoke an API key and the keys made with it. Every gateway stops accepting them within a
/// second.
///
/// A key may be revoked by itself and its ancestors, by the person who made it, and by
/// admins and owners of at least its role.
#[utoipa::path(delete, path = "/v1/api-keys/{id}", tag = "api-keys", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "API key id")),
    responses((status = 204, description = "Revoked"), (status = 403, description = "Role does not allow this (`forbidden`)", body = ErrorBody), (status = 404, description = "Not found in the caller's team (`not_found`)", body = ErrorBody)))]
async fn revoke_key(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    let audit = context.action("api_key.revoke");
    let mut transaction = state.db.begin().await?;
    let revoked = keys::revoke(&mut transaction, &principal, id).await?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("api_key:{id}")),
            serde_json::json!({ "public_ids": revoked }),
        )
        .await?;
    transaction.commit().await?;
    for public_id in revoked {
        state
            .auth
            .invalidator
            .publish(Invalidation::Key(public_id))
            .await;
    }
    Ok(StatusCode::NO_CONTENT)
}
