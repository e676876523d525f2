//! [`Principal`] as an extractor: extracting it authenticates the request, tells the audit
//! layer who called (or that authentication failed), refuses further failures of an address
//! that failed too often (never a valid credential), and counts the request against the
//! caller's rate limit. [`guarded`] is that address guard, for every other way in.

use std::net::IpAddr;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::client_ip::ClientIp;
use crate::audit::AuditSlot;
use crate::auth::Principal;
use crate::auth::authenticate::{authenticate, rate_limit};
use crate::error::ApiError;
use crate::state::AppState;

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let slot = parts.extensions.get::<AuditSlot>().cloned();
        let ip = ClientIp::from_request_parts(parts, state).await?.0;
        let header = parts.headers.get(AUTHORIZATION);
        let result = guarded(state, ip, |budgeted| authenticate(header, state, budgeted)).await;
        if let Some(slot) = slot {
            match &result {
                Ok(principal) => slot.set_principal(principal),
                Err(error) if error.is_authentication_failure() => {
                    slot.set_authentication_failure(error.team_id())
                }
                Err(_) => {}
            }
        }
        let principal = result?;
        rate_limit(&principal, state).await?;
        Ok(principal)
    }
}

/// One authentication from the address `ip`, under its failed-authentication guard. The
/// credential is always checked first, so a valid key is served even from an address that
/// has spent its failures (behind a shared proxy, everyone's). Only failures are counted and,
/// once the address has spent them, refused with 429; while it has, `attempt` is told to
/// keep its Postgres reads within the gateway's small budget (`budgeted`).
pub async fn guarded<T, F>(
    state: &AppState,
    ip: Option<IpAddr>,
    attempt: impl FnOnce(bool) -> F,
) -> Result<T, ApiError>
where
    F: Future<Output = Result<T, ApiError>>,
{
    let shut_out = ip.and_then(|ip| state.auth.ip_guard.may_fail(ip).err());
    let result = attempt(shut_out.is_some()).await;
    if let (Some(ip), Err(error)) = (ip, &result)
        && error.is_authentication_failure()
        && !matches!(error, ApiError::Unauthenticated)
    {
        state.auth.ip_guard.failed(ip);
        if let Some(retry_after_secs) = shut_out {
            return Err(ApiError::RateLimited { retry_after_secs });
        }
    }
    result
}
