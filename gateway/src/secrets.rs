//! The team's credentials in the vault: the rules a secret follows, and reading values back
//! only for the worker of a sandbox that names them. Values never appear in an answer, a log
//! line, an error or an audit row.

use chrono::{DateTime, Utc};
use sandbase_api::Role;
use sandbase_api::secrets::{Injection, Secret, UsableBy};
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Largest secret value.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Most hosts one secret is bound to.
pub const MAX_HOSTS: usize = 32;

/// Headers a credential cannot set (the connection's own, which the proxy owns).
pub const FORBIDDEN_HEADERS: &[&str] = &[
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

pub fn keyring(state: &AppState) -> ApiResult<&sandbase_vault::Keyring> {
    state
        .vault
        .as_deref()
        .ok_or_else(|| ApiError::VaultNotConfigured)
}

pub fn vault_error(error: sandbase_vault::VaultError) -> ApiError {
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

pub fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

/// Checks an injection (exactly one mode) against the value it will carry.
pub fn validate_injection(inject: &Injection, value: Option<&str>) -> ApiResult<()> {
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
        let lowercase = header.to_ascii_lowercase();
        if !is_token(header) || FORBIDDEN_HEADERS.contains(&lowercase.as_str()) {
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
    if let Some(placeholder) = &inject.placeholder {
        validate_placeholder(&placeholder.options())?;
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

/// Most paths a placeholder's body and URL swaps apply to.
pub const MAX_PLACEHOLDER_PATHS: usize = 32;

fn validate_placeholder(options: &sandbase_api::secrets::PlaceholderOptions) -> ApiResult<()> {
    let name = &options.env;
    if name.is_empty()
        || name.len() > 128
        || name.starts_with(|c: char| c.is_ascii_digit())
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(ApiError::InvalidRequest(
            "`inject.placeholder`: an environment variable name (letters, digits, `_`)".to_owned(),
        ));
    }
    if (options.in_body || options.in_url) && options.paths.is_empty() {
        return Err(ApiError::InvalidRequest(
            "`inject.placeholder.paths`: name the request paths the body or URL swap is for \
             (`/v1/chat/*`)"
                .to_owned(),
        ));
    }
    if !options.in_body && !options.in_url && !options.paths.is_empty() {
        return Err(ApiError::InvalidRequest(
            "`inject.placeholder.paths` applies only with `in_body` or `in_url`".to_owned(),
        ));
    }
    let bad = options.paths.iter().find(|path| {
        let pattern = path.strip_suffix('*').unwrap_or(path);
        !path.starts_with('/')
            || path.len() > 256
            || pattern.contains('*')
            || path.chars().any(|c| c.is_control() || c.is_whitespace())
    });
    if options.paths.len() > MAX_PLACEHOLDER_PATHS || bad.is_some() {
        return Err(ApiError::InvalidRequest(format!(
            "`inject.placeholder.paths`: at most {MAX_PLACEHOLDER_PATHS} paths, each starting \
             with `/`, with at most one `*`, at the end"
        )));
    }
    let bad_header = options
        .headers
        .iter()
        .any(|header| http::HeaderName::from_bytes(header.as_bytes()).is_err());
    if options.headers.len() > MAX_PLACEHOLDER_PATHS || bad_header {
        return Err(ApiError::InvalidRequest(format!(
            "`inject.placeholder.headers`: at most {MAX_PLACEHOLDER_PATHS} request header names"
        )));
    }
    Ok(())
}

pub fn validate_hosts(hosts: &[String]) -> ApiResult<Vec<String>> {
    sandbase_egress::parse_patterns("hosts", hosts, MAX_HOSTS).map_err(ApiError::InvalidRequest)
}

#[derive(sqlx::FromRow)]
pub struct SecretRow {
    pub id: Uuid,
    pub name: String,
    pub hosts: sqlx::types::Json<Vec<String>>,
    pub inject: sqlx::types::Json<Injection>,
    pub usable_by: String,
    pub version: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl SecretRow {
    pub fn usable_by(&self) -> UsableBy {
        UsableBy::parse(&self.usable_by).unwrap_or_default()
    }

    pub fn to_api(&self) -> Secret {
        Secret {
            id: self.id,
            name: self.name.clone(),
            hosts: self.hosts.0.clone(),
            inject: self.inject.0.clone(),
            usable_by: self.usable_by(),
            version: self.version,
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

pub const SECRET_COLUMNS: &str =
    "id, name, hosts, inject, usable_by, version, created_at, updated_at";

/// 422 `unknown_credential` unless the team has a secret by each name; 403
/// `credential_not_usable` when one is for a role above the caller's (`usable_by`).
pub async fn ensure_usable(
    state: &AppState,
    principal: &Principal,
    names: &[String],
) -> ApiResult<()> {
    if names.is_empty() {
        return Ok(());
    }
    let found: Vec<(String, String)> =
        sqlx::query_as("SELECT name, usable_by FROM secrets WHERE team_id = $1 AND name = ANY($2)")
            .bind(principal.team_id)
            .bind(names)
            .fetch_all(&state.db)
            .await?;
    if let Some(missing) = names
        .iter()
        .find(|name| !found.iter().any(|(found, _)| found == *name))
    {
        return Err(unknown_credential(missing));
    }
    for (name, usable_by) in found {
        let needed = match UsableBy::parse(&usable_by).unwrap_or_default() {
            UsableBy::Admin => Role::Admin,
            UsableBy::Member => Role::Member,
        };
        if !principal.role.at_least(needed) {
            return Err(ApiError::CredentialNotUsable(name, needed));
        }
    }
    Ok(())
}

fn unknown_credential(name: &str) -> ApiError {
    ApiError::UnknownCredential(name.to_owned())
}

/// The decrypted credentials `names` of `team_id`, for the worker that will run the sandbox
/// naming them (sent over the internal channel at create, never stored elsewhere). Unknown
/// names are refused by name.
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
