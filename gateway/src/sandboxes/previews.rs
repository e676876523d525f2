//! Preview URLs: a port of a live sandbox at `{port}-{sandbox_id}.{previews.domain}`, routed
//! by `Host` on the public listener to the sandbox's worker, which connects to the port inside
//! the sandbox's network namespace (the sandbox is never opened to a network). A preview is a
//! row per (sandbox, port) with the hash of its token; access is by that token in
//! `x-sandbase-preview-token`, by a signed expiring URL (traded for a cookie of the preview's
//! own host), or by anyone when it is public.

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sandbase_api::previews::{CreatedPreview, NewPreview, PREVIEW_SIGNATURE_PARAM, Preview};
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::forward;
use super::row::Owner;
use crate::audit::Requester;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Ports one sandbox may have open as previews.
pub const MAX_PER_SANDBOX: i64 = 16;
/// How long a signed URL works unless asked otherwise, and at most.
const SIGNED_TTL_SECS: u64 = 3600;
const MAX_SIGNED_TTL_SECS: u64 = 7 * 24 * 3600;

/// What a preview host names: a port of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub port: u16,
    pub sandbox: Uuid,
}

/// The port and sandbox a `Host` header names under `domain`, if it is a preview host.
pub fn parse_host(host: &str, domain: &str) -> Option<Target> {
    let host = host.trim_end_matches('.');
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let label = name
        .len()
        .checked_sub(domain.len() + 1)
        .filter(|&cut| name.as_bytes()[cut] == b'.' && name[cut + 1..].eq_ignore_ascii_case(domain))
        .map(|cut| &name[..cut])?;
    let (port, sandbox) = label.split_once('-')?;
    if port.starts_with('0') {
        return None;
    }
    Some(Target {
        port: port.parse().ok().filter(|&port| port > 0)?,
        sandbox: Uuid::parse_str(sandbox).ok()?,
    })
}

pub use super::preview_cache::PreviewRow;

impl PreviewRow {
    pub fn to_api(&self, state: &AppState) -> ApiResult<Preview> {
        let port = u16::try_from(self.port).unwrap_or_default();
        Ok(Preview {
            sandbox_id: self.sandbox_id,
            port,
            url: url(state, port, self.sandbox_id)?,
            public: self.public,
            created_at: self.created_at,
        })
    }
}

const COLUMNS: &str = "sandbox_id, port, team_id, public, token_hash, created_at";

fn domain(state: &AppState) -> ApiResult<&str> {
    state
        .settings
        .previews
        .domain
        .as_deref()
        .ok_or(ApiError::PreviewsNotConfigured)
}

/// The preview URL of `port` of `sandbox`.
pub fn url(state: &AppState, port: u16, sandbox: Uuid) -> ApiResult<String> {
    let settings = &state.settings.previews;
    let domain = domain(state)?;
    let suffix = match (settings.scheme.as_str(), settings.port) {
        (_, None) | ("http", Some(80)) | ("https", Some(443)) => String::new(),
        (_, Some(port)) => format!(":{port}"),
    };
    Ok(format!(
        "{}://{port}-{sandbox}.{domain}{suffix}/",
        settings.scheme
    ))
}

/// Opens (or re-opens, with a new token) a port of a live sandbox of `owner`'s team; the row
/// commits with `requester`'s audit row.
pub async fn open(
    state: &AppState,
    owner: Owner,
    requester: Requester<'_>,
    sandbox: Uuid,
    request: &NewPreview,
) -> ApiResult<CreatedPreview> {
    domain(state)?;
    if request.port == 0 {
        return Err(ApiError::InvalidRequest(
            "`port` must be between 1 and 65535".to_owned(),
        ));
    }
    let ttl = request.signed_url_ttl_secs.unwrap_or(SIGNED_TTL_SECS);
    if !(60..=MAX_SIGNED_TTL_SECS).contains(&ttl) {
        return Err(ApiError::InvalidRequest(format!(
            "`signed_url_ttl_secs` must be between 60 and {MAX_SIGNED_TTL_SECS}"
        )));
    }
    // The sandbox must be the team's and live.
    forward::route(state, owner.team_id, sandbox).await?;
    let token = new_token();
    let hash = Sha256::digest(token.as_bytes()).to_vec();
    let mut transaction = state.db.begin().await?;
    let row: Option<PreviewRow> = sqlx::query_as(&format!(
        "INSERT INTO previews (sandbox_id, port, team_id, public, token_hash, api_key_id, user_id) \
         SELECT $1, $2, $3, $4, $5, $6, $7 \
         WHERE (SELECT count(*) FROM previews WHERE sandbox_id = $1 AND port <> $2) < $8 \
         ON CONFLICT (sandbox_id, port) DO UPDATE SET public = $4, token_hash = $5, \
           api_key_id = $6, user_id = $7, created_at = now() \
         RETURNING {COLUMNS}"
    ))
    .bind(sandbox)
    .bind(i32::from(request.port))
    .bind(owner.team_id)
    .bind(request.public)
    .bind(&hash)
    .bind(owner.api_key_id)
    .bind(owner.user_id)
    .bind(MAX_PER_SANDBOX)
    .fetch_optional(&mut *transaction)
    .await?;
    let row = row.ok_or_else(|| {
        ApiError::InvalidRequest(format!(
            "a sandbox has at most {MAX_PER_SANDBOX} previews: remove one first"
        ))
    })?;
    requester
        .record(
            &mut transaction,
            Some(format!("sandbox:{sandbox}")),
            serde_json::json!({ "port": request.port, "public": request.public }),
        )
        .await?;
    transaction.commit().await?;
    state.sandboxes.preview_cache.forget(sandbox, request.port);
    let expires = Utc::now() + chrono::Duration::seconds(ttl as i64);
    let signature = sign(state, &row, expires.timestamp());
    let preview = row.to_api(state)?;
    let signed_url = format!("{}?{PREVIEW_SIGNATURE_PARAM}={signature}", preview.url);
    Ok(CreatedPreview {
        preview,
        token,
        signed_url,
        signed_url_expires_at: expires,
    })
}

/// The previews of a sandbox of `team_id`.
pub async fn list(state: &AppState, team_id: Uuid, sandbox: Uuid) -> ApiResult<Vec<PreviewRow>> {
    super::row::fetch(&state.db, team_id, sandbox)
        .await?
        .ok_or(ApiError::NotFound("sandbox"))?;
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM previews WHERE sandbox_id = $1 AND team_id = $2 ORDER BY port"
    ))
    .bind(sandbox)
    .bind(team_id)
    .fetch_all(&state.db)
    .await?)
}

/// Closes a preview: its token and signed URLs stop working at once. The removal commits
/// with `requester`'s audit row.
pub async fn close(
    state: &AppState,
    team_id: Uuid,
    requester: Requester<'_>,
    sandbox: Uuid,
    port: u16,
) -> ApiResult<()> {
    let mut transaction = state.db.begin().await?;
    let deleted =
        sqlx::query("DELETE FROM previews WHERE sandbox_id = $1 AND port = $2 AND team_id = $3")
            .bind(sandbox)
            .bind(i32::from(port))
            .bind(team_id)
            .execute(&mut *transaction)
            .await?;
    if deleted.rows_affected() == 0 {
        return Err(ApiError::NotFound("preview"));
    }
    requester
        .record(
            &mut transaction,
            Some(format!("sandbox:{sandbox}")),
            serde_json::json!({ "port": port }),
        )
        .await?;
    transaction.commit().await?;
    state.sandboxes.preview_cache.forget(sandbox, port);
    Ok(())
}

/// The preview a request names, if it exists: from this gateway's cache when it was read
/// in the last [`CACHE_TTL`](super::preview_cache::CACHE_TTL) (opening or closing it here drops it from the cache; another
/// gateway's change is seen within that time).
pub async fn find(state: &AppState, target: Target) -> ApiResult<Option<PreviewRow>> {
    if let Some(cached) = state
        .sandboxes
        .preview_cache
        .get(target.sandbox, target.port)
    {
        return Ok(cached);
    }
    let row: Option<PreviewRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM previews WHERE sandbox_id = $1 AND port = $2"
    ))
    .bind(target.sandbox)
    .bind(i32::from(target.port))
    .fetch_optional(&state.db)
    .await?;
    state
        .sandboxes
        .preview_cache
        .put(target.sandbox, target.port, row.clone());
    Ok(row)
}

/// How a request to a preview host proves it may pass.
#[derive(Debug, Default)]
pub struct Presented<'a> {
    pub token: Option<&'a str>,
    /// A signature from a signed URL or the cookie it left (`EXPIRY.SIGNATURE`).
    pub signature: Option<&'a str>,
}

/// What opened a preview for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// A public preview: anyone.
    Public,
    /// The preview's token, in a header (which no other site can make a browser send).
    Token,
    /// A signature: the cookie a signed URL left (which a browser sends with any request to
    /// the preview's host, whichever page makes it).
    Cookie,
}

/// What in `presented` opens `preview` now, if anything.
pub fn admits(
    state: &AppState,
    preview: &PreviewRow,
    presented: &Presented<'_>,
) -> Option<Admitted> {
    use subtle::ConstantTimeEq;
    if preview.public {
        return Some(Admitted::Public);
    }
    if let Some(token) = presented.token {
        let hash = Sha256::digest(token.as_bytes());
        if bool::from(hash.as_slice().ct_eq(&preview.token_hash)) {
            return Some(Admitted::Token);
        }
    }
    presented
        .signature
        .is_some_and(|signature| signature_valid(state, preview, signature).is_some())
        .then_some(Admitted::Cookie)
}

/// When a signature for `preview` expires, if it is genuine and current.
pub fn signature_valid(
    state: &AppState,
    preview: &PreviewRow,
    signature: &str,
) -> Option<DateTime<Utc>> {
    use subtle::ConstantTimeEq;
    let (expiry, _) = signature.split_once('.')?;
    let expiry: i64 = expiry.parse().ok()?;
    let expires = DateTime::<Utc>::from_timestamp(expiry, 0)?;
    let genuine = sign(state, preview, expiry);
    (bool::from(genuine.as_bytes().ct_eq(signature.as_bytes())) && expires > Utc::now())
        .then_some(expires)
}

/// `EXPIRY.SIGNATURE`: the preview (sandbox, port and token hash, so a new token or a
/// removed preview voids it) and the expiry, signed with a key derived from the session
/// secret.
fn sign(state: &AppState, preview: &PreviewRow, expiry: i64) -> String {
    use base64::Engine;
    let secret = state
        .settings
        .auth
        .jwt_secret
        .as_ref()
        .map(|secret| secret.expose_secret().as_bytes().to_vec())
        .unwrap_or_default();
    let mut key = Hmac::<Sha256>::new_from_slice(&secret).expect("HMAC takes any key length");
    key.update(b"sandbase preview urls v1");
    let key = key.finalize().into_bytes();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key length");
    mac.update(
        format!(
            "{}:{}:{expiry}:{}",
            preview.sandbox_id,
            preview.port,
            hex::encode(&preview.token_hash)
        )
        .as_bytes(),
    );
    let signature =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{expiry}.{signature}")
}

fn new_token() -> String {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "sbp_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preview_hosts_name_a_port_and_a_sandbox_under_the_domain_only() {
        let id = Uuid::now_v7();
        let domain = "preview.localhost";
        let target = Target {
            port: 8000,
            sandbox: id,
        };
        for host in [
            format!("8000-{id}.preview.localhost"),
            format!("8000-{id}.preview.localhost:8080"),
            format!("8000-{id}.PREVIEW.localhost."),
            format!("8000-{}.preview.localhost", id.to_string().to_uppercase()),
        ] {
            assert_eq!(parse_host(&host, domain), Some(target), "{host}");
        }
        for host in [
            format!("8000-{id}.preview.localhostx"),
            format!("8000-{id}.xpreview.localhost"),
            format!("8000-{id}.evil.example"),
            format!("0-{id}.preview.localhost"),
            format!("08000-{id}.preview.localhost"),
            format!("70000-{id}.preview.localhost"),
            format!("8000{id}.preview.localhost"),
            format!("x.8000-{id}.preview.localhost"),
            "preview.localhost".to_owned(),
            ".preview.localhost".to_owned(),
            "8000-nope.preview.localhost".to_owned(),
        ] {
            assert_eq!(parse_host(&host, domain), None, "{host}");
        }
    }
}
