//! Turning a bearer token into a [`Principal`]: API keys from the in-process cache (a hash
//! lookup; PostgreSQL on a miss), session tokens checked against the membership on every
//! request; then the caller's rate limit.

use std::sync::Arc;

use chrono::Utc;
use sandbase_api::Role;

use super::api_key::{self, ApiKeyToken, KeyRecord};
use super::key_cache::Lookup;
use super::session;
use super::{Actor, Principal};
use crate::error::ApiError;
use crate::ratelimit::Decision;
use crate::state::AppState;

/// The caller behind an `Authorization` header (`Bearer <API key | session token>`).
/// `budgeted`: a key missing from the cache is read from Postgres only within the gateway's
/// budget for addresses that spent their failed authentications (429 beyond it).
pub async fn authenticate(
    header: Option<&http::HeaderValue>,
    state: &AppState,
    budgeted: bool,
) -> Result<Principal, ApiError> {
    let header = header.ok_or(ApiError::Unauthenticated)?;
    let value = header
        .to_str()
        .map_err(|_| ApiError::InvalidApiKey { team_id: None })?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .ok_or(ApiError::Unauthenticated)?;
    if token.starts_with("sb_") {
        authenticate_api_key(token, state, budgeted).await
    } else if session::looks_like_jwt(token) {
        authenticate_session(token, state).await
    } else {
        Err(ApiError::InvalidApiKey { team_id: None })
    }
}

async fn authenticate_api_key(
    token: &str,
    state: &AppState,
    budgeted: bool,
) -> Result<Principal, ApiError> {
    let token = ApiKeyToken::parse(token).ok_or(ApiError::InvalidApiKey { team_id: None })?;
    let record = key_record(state, &token.public_id, budgeted)
        .await?
        .ok_or(ApiError::InvalidApiKey { team_id: None })?;
    // Check the secret before saying anything about the key's state, so a guessed
    // public id learns nothing.
    if !token.matches(&record.secret_hash) {
        return Err(ApiError::InvalidApiKey {
            team_id: Some(record.team_id),
        });
    }
    key_principal(record, state)
}

/// A key's cached record (loaded on a miss), or `None` for a key that does not exist.
pub(crate) async fn key_record(
    state: &AppState,
    public_id: &str,
    budgeted: bool,
) -> Result<Option<Arc<KeyRecord>>, ApiError> {
    Ok(match state.auth.keys.get(public_id) {
        Lookup::Known(record) => Some(record),
        Lookup::Unknown => None,
        Lookup::Miss => {
            if budgeted {
                state
                    .auth
                    .ip_guard
                    .may_look_up()
                    .map_err(|retry_after_secs| ApiError::RateLimited { retry_after_secs })?;
            }
            let epoch = state.auth.keys.epoch();
            state.auth.keys.note_lookup();
            match KeyRecord::load(&state.db, public_id).await? {
                Some(record) => Some(state.auth.keys.insert(epoch, Arc::new(record))),
                None => {
                    state.auth.keys.insert_unknown(epoch, public_id);
                    None
                }
            }
        }
    })
}

/// The caller a key makes, unless it is revoked or expired (its use recorded).
pub(crate) fn key_principal(
    record: Arc<KeyRecord>,
    state: &AppState,
) -> Result<Principal, ApiError> {
    if record.revoked {
        return Err(ApiError::ApiKeyRevoked {
            team_id: record.team_id,
        });
    }
    let now = Utc::now();
    if record
        .expires_at
        .is_some_and(|expires_at| expires_at <= now)
    {
        return Err(ApiError::ApiKeyExpired {
            team_id: record.team_id,
        });
    }
    record.touch(&state.auth.last_used, now);
    Ok(Principal {
        team_id: record.team_id,
        role: record.role,
        rate_limit: record.rate_limit,
        actor: Actor::ApiKey(record),
    })
}

async fn authenticate_session(token: &str, state: &AppState) -> Result<Principal, ApiError> {
    let claims = state.auth.sessions.verify(token, Utc::now())?;
    member_principal(state, claims.team, claims.sub)
        .await?
        .ok_or(ApiError::InvalidSession)
}

/// A member of a team as the caller, with the role they hold now (`None`: not a member).
/// Sessions are checked against the membership on every request, so a removed member or a
/// changed role takes effect at once. Dashboard traffic is light; API keys are the hot path
/// and are cached.
pub(crate) async fn member_principal(
    state: &AppState,
    team_id: uuid::Uuid,
    user_id: uuid::Uuid,
) -> Result<Option<Principal>, ApiError> {
    let row: Option<(String, Option<i32>, Option<i32>)> = sqlx::query_as(
        "SELECT m.role, t.rate_limit_per_sec, t.rate_limit_burst \
         FROM team_members m JOIN teams t ON t.id = m.team_id \
         WHERE m.team_id = $1 AND m.user_id = $2",
    )
    .bind(team_id)
    .bind(user_id)
    .fetch_optional(&state.db)
    .await?;
    let Some((role, rate, burst)) = row else {
        return Ok(None);
    };
    let role: Role = role
        .parse()
        .map_err(|error: String| ApiError::Internal(anyhow::anyhow!(error)))?;
    Ok(Some(Principal {
        team_id,
        role,
        actor: Actor::User { id: user_id },
        rate_limit: api_key::team_rate_limit(rate, burst),
    }))
}

/// Counts a request against the caller's rate limit, then against its team's ceiling (so a
/// team cannot multiply its rate by minting keys).
pub async fn rate_limit(principal: &Principal, state: &AppState) -> Result<(), ApiError> {
    let defaults = state.settings.rate_limit;
    let (subject, lease) = match &principal.actor {
        Actor::ApiKey(record) => (format!("key:{}", record.public_id), Some(&record.lease)),
        Actor::User { id } => (format!("user:{id}:{}", principal.team_id), None),
    };
    let (per_second, burst) = principal
        .rate_limit
        .unwrap_or((defaults.per_second, defaults.burst));
    check(state, &subject, lease, (per_second, burst)).await?;
    let team_lease = state.auth.team_leases.of(principal.team_id);
    let ceiling = (
        defaults.team_per_second.max(per_second),
        defaults.team_burst.max(burst),
    );
    let subject = format!("team:{}", principal.team_id);
    check(state, &subject, Some(&team_lease), ceiling).await
}

/// One bucket's check; Redis failing admits (capacity, not correctness).
async fn check(
    state: &AppState,
    subject: &str,
    lease: Option<&Arc<crate::ratelimit::Lease>>,
    (per_second, burst): (u32, u32),
) -> Result<(), ApiError> {
    let mut redis = state.redis.clone();
    match state
        .auth
        .rate_limiter
        .check(&mut redis, subject, lease, per_second, burst)
        .await
    {
        Ok(Decision::Allowed) => Ok(()),
        Ok(Decision::Limited { retry_after_secs }) => {
            metrics::counter!("sandbase_rate_limited_total").increment(1);
            Err(ApiError::RateLimited { retry_after_secs })
        }
        Err(error) => {
            // Rate limiting protects capacity, not correctness: when Redis is unreachable,
            // requests are served rather than all refused (readyz reports the outage).
            metrics::counter!("sandbase_rate_limit_errors_total").increment(1);
            tracing::warn!(error = %error, "rate limit check failed; admitting the request");
            Ok(())
        }
    }
}
