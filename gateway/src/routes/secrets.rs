//! The team's credentials: set, list (metadata only), new version, remove. A value is
//! encrypted before it is written (the vault) and is never in an answer, a log line, an
//! error or an audit row.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use sandbase_api::secrets::{
    CreateSecretRequest, Injection, Secret, SecretList, UpdateSecretRequest,
};
use sandbase_api::{ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath};
use crate::state::AppState;

/// Largest secret value.
const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Most hosts one secret is bound to.
const MAX_HOSTS: usize = 32;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_secrets, create_secret))
        .routes(routes!(update_secret, delete_secret))
}

fn keyring(state: &AppState) -> ApiResult<&sandbase_vault::Keyring> {
    state.vault.as_deref().ok_or_else(|| {
        ApiError::problem(
            StatusCode::NOT_IMPLEMENTED,
            "vault_not_configured",
            "the credential vault has no key on this deployment (vault.keys or vault.key_file)",
        )
    })
}

fn vault_error(error: sandbase_vault::VaultError) -> ApiError {
    match error {
        sandbase_vault::VaultError::Database(error) => error.into(),
        // Never the value: the error says which step failed, nothing of the data.
        other => ApiError::Internal(anyhow::anyhow!("vault: {other}")),
    }
}

pub fn validate_name(name: &str) -> ApiResult<()> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if valid {
        Ok(())
    } else {
        Err(ApiError::InvalidRequest(
            "`name`: 1 to 64 letters, digits, `_`, `.` or `-`, starting with a letter or digit"
                .to_owned(),
        ))
    }
}

fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

/// Checks an injection (exactly one mode) against the value it will carry.
fn validate_injection(inject: &Injection, value: Option<&str>) -> ApiResult<()> {
    let modes = [
        inject.header.is_some(),
        inject.basic.is_some(),
        inject.query.is_some(),
        inject.placeholder.is_some(),
    ]
    .iter()
    .filter(|mode| **mode)
    .count();
    if modes != 1 || (inject.format.is_some() && inject.header.is_none()) {
        return Err(ApiError::InvalidRequest(
            "`inject`: exactly one of {header, format}, {basic: {username}}, {query} or {placeholder}".to_owned(),
        ));
    }
    if let Some(header) = &inject.header {
        let forbidden = [
            "host",
            "connection",
            "content-length",
            "transfer-encoding",
            "upgrade",
            "te",
            "trailer",
            "proxy-connection",
            "keep-alive",
        ];
        if !is_token(header) || forbidden.contains(&header.to_ascii_lowercase().as_str()) {
            return Err(ApiError::InvalidRequest(format!(
                "`inject.header`: `{header}` is not a header name a credential can set"
            )));
        }
        let format = inject.format.as_deref().unwrap_or("{value}");
        if !format.contains("{value}")
            || format.len() > 512
            || format.chars().any(|c| c.is_control())
        {
            return Err(ApiError::InvalidRequest(
                "`inject.format` must contain `{value}` and no control characters".to_owned(),
            ));
        }
    }
    if let Some(basic) = &inject.basic
        && (basic.username.is_empty()
            || basic.username.len() > 256
            || basic.username.contains(':')
            || basic.username.chars().any(|c| c.is_control()))
    {
        return Err(ApiError::InvalidRequest(
            "`inject.basic.username`: 1 to 256 characters, no `:` or control characters".to_owned(),
        ));
    }
    if let Some(query) = &inject.query
        && (query.is_empty()
            || query.len() > 128
            || !query
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(ApiError::InvalidRequest(
            "`inject.query`: 1 to 128 letters, digits, `_`, `-` or `.`".to_owned(),
        ));
    }
    if let Some(name) = &inject.placeholder
        && (name.is_empty()
            || name.len() > 128
            || name.starts_with(|c: char| c.is_ascii_digit())
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(ApiError::InvalidRequest(
            "`inject.placeholder`: an environment variable name (letters, digits, `_`)".to_owned(),
        ));
    }
    if let Some(value) = value {
        if value.is_empty() || value.len() > MAX_VALUE_BYTES {
            return Err(ApiError::InvalidRequest(format!(
                "`value`: 1 to {MAX_VALUE_BYTES} bytes"
            )));
        }
        // Headers, user info and query strings cannot carry line breaks or NULs.
        if value.chars().any(|c| c.is_control()) {
            return Err(ApiError::InvalidRequest(
                "`value` cannot contain control characters (line breaks, NUL, …)".to_owned(),
            ));
        }
    }
    Ok(())
}

fn validate_hosts(hosts: &[String]) -> ApiResult<Vec<String>> {
    sandbase_egress::parse_patterns("hosts", hosts, MAX_HOSTS).map_err(ApiError::InvalidRequest)
}

#[derive(sqlx::FromRow)]
struct SecretRow {
    id: Uuid,
    name: String,
    hosts: sqlx::types::Json<Vec<String>>,
    inject: sqlx::types::Json<Injection>,
    version: i32,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl SecretRow {
    fn to_api(&self) -> Secret {
        Secret {
            id: self.id,
            name: self.name.clone(),
            hosts: self.hosts.0.clone(),
            inject: self.inject.0.clone(),
            version: self.version,
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

const SECRET_COLUMNS: &str = "id, name, hosts, inject, version, created_at, updated_at";

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
    principal.require(Role::Admin)?;
    let keyring = keyring(&state)?;
    let value = sandbase_vault::Zeroizing::new(request.value);
    validate_name(&request.name)?;
    let hosts = validate_hosts(&request.hosts)?;
    validate_injection(&request.inject, Some(&value))?;
    let id = Uuid::now_v7();
    let mut transaction = state.db.begin().await?;
    let inserted: Option<SecretRow> = sqlx::query_as(&format!(
        "INSERT INTO secrets (id, team_id, name, hosts, inject, version, created_by) \
         VALUES ($1, $2, $3, $4, $5, 1, $6) ON CONFLICT (team_id, name) DO NOTHING \
         RETURNING {SECRET_COLUMNS}"
    ))
    .bind(id)
    .bind(principal.team_id)
    .bind(&request.name)
    .bind(sqlx::types::Json(&hosts))
    .bind(sqlx::types::Json(&request.inject))
    .bind(principal.user_id())
    .fetch_optional(&mut *transaction)
    .await?;
    let Some(row) = inserted else {
        return Err(ApiError::Conflict {
            code: "secret_exists",
            message: format!(
                "a secret named `{}` exists; PUT /v1/secrets/{} sets a new value",
                request.name, request.name
            ),
        });
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
    context
        .record(
            &mut transaction,
            &principal,
            Some(format!("secret:{}", request.name)),
            serde_json::json!({ "hosts": hosts, "version": 1 }),
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
    ))]
async fn update_secret(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<UpdateSecretRequest>,
) -> ApiResult<Json<Secret>> {
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
    let version = current.version + 1;
    let row: SecretRow = sqlx::query_as(&format!(
        "UPDATE secrets SET hosts = $2, inject = $3, version = $4, updated_at = now() \
         WHERE id = $1 RETURNING {SECRET_COLUMNS}"
    ))
    .bind(current.id)
    .bind(sqlx::types::Json(&hosts))
    .bind(sqlx::types::Json(&inject))
    .bind(version)
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
    context
        .record(
            &mut transaction,
            &principal,
            Some(format!("secret:{name}")),
            serde_json::json!({ "hosts": hosts, "version": version }),
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
    context
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

/// The decrypted credentials `names` of `team_id`, for the worker that will run the sandbox
/// naming them (sent over the internal channel at create, never stored elsewhere). Unknown
/// names are refused by name.
/// 422 `unknown_credential` unless the team has a secret by each name.
pub async fn ensure_exist(state: &AppState, team_id: Uuid, names: &[String]) -> ApiResult<()> {
    if names.is_empty() {
        return Ok(());
    }
    let found: Vec<String> =
        sqlx::query_scalar("SELECT name FROM secrets WHERE team_id = $1 AND name = ANY($2)")
            .bind(team_id)
            .bind(names)
            .fetch_all(&state.db)
            .await?;
    match names.iter().find(|name| !found.contains(name)) {
        Some(missing) => Err(unknown_credential(missing)),
        None => Ok(()),
    }
}

fn unknown_credential(name: &str) -> ApiError {
    ApiError::problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_credential",
        format!("this team has no secret named `{name}` (POST /v1/secrets)"),
    )
}

pub async fn unseal_for_sandbox(
    state: &AppState,
    team_id: Uuid,
    names: &[String],
) -> ApiResult<Vec<sandbase_api::internal::SandboxCredential>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let keyring = keyring(state)?;
    let mut connection = state.db.acquire().await?;
    let rows: Vec<SecretRow> = sqlx::query_as(&format!(
        "SELECT {SECRET_COLUMNS} FROM secrets WHERE team_id = $1 AND name = ANY($2)"
    ))
    .bind(team_id)
    .bind(names)
    .fetch_all(&mut *connection)
    .await?;
    if let Some(missing) = names
        .iter()
        .find(|name| !rows.iter().any(|row| &row.name == *name))
    {
        return Err(unknown_credential(missing));
    }
    let mut credentials = Vec::with_capacity(rows.len());
    for row in rows {
        let mut value =
            sandbase_vault::reveal(&mut connection, keyring, team_id, row.id, row.version)
                .await
                .map_err(vault_error)?;
        let value = String::from_utf8(std::mem::take(&mut *value))
            .map_err(|_| ApiError::Internal(anyhow::anyhow!("a secret is not UTF-8")))?;
        credentials.push(sandbase_api::internal::SandboxCredential {
            name: row.name,
            hosts: row.hosts.0,
            inject: row.inject.0,
            value,
        });
    }
    Ok(credentials)
}
