//! [`Principal`] as an extractor: extracting it authenticates the request, tells the audit
//! layer who called (or that authentication failed), refuses an address that failed too
//! often before looking anything up, and counts the request against the
//! caller's rate limit.

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
        // An address that spent its failed authentications is not even looked up.
        let ip = ClientIp::from_request_parts(parts, state).await?.0;
        if let Some(ip) = ip {
            state
                .auth
                .ip_guard
                .may_authenticate(ip)
                .map_err(|retry_after_secs| ApiError::RateLimited { retry_after_secs })?;
        }
        let result = authenticate(parts.headers.get(AUTHORIZATION), state).await;
        if let (Some(ip), Err(error)) = (ip, &result)
            && error.is_authentication_failure()
            && !matches!(error, ApiError::Unauthenticated)
        {
            state.auth.ip_guard.failed(ip);
        }
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
