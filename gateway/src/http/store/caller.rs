//! Who calls the store: the SandBase key as `Authorization: Bearer` or as `x-api-key`, or a
//! sandbox's store credential (added by its node's egress proxy).

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderValue};

use crate::auth::authenticate::{authenticate, rate_limit};
use crate::auth::store_token;
use crate::error::ApiError;
use crate::http::principal::guarded;
use crate::state::AppState;
use crate::store::Caller;

/// The caller, from `Authorization: Bearer TOKEN` or `x-api-key: TOKEN`, under the address
/// `ip`'s failed-authentication guard, counted against its rate limit.
pub async fn caller(
    state: &AppState,
    headers: &HeaderMap,
    ip: Option<IpAddr>,
) -> Result<Caller, ApiError> {
    let from_x_api_key = headers
        .get("x-api-key")
        .and_then(|value| value.to_str().ok())
        .and_then(|key| HeaderValue::from_str(&format!("Bearer {}", key.trim())).ok());
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .cloned()
        .or(from_x_api_key);
    let sandbox_token = header
        .as_ref()
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| token.starts_with(store_token::PREFIX));
    let header = header.as_ref();
    let (principal, sandbox) = guarded(state, ip, |budgeted| async move {
        match sandbox_token {
            Some(token) => {
                if budgeted {
                    // Every sandbox credential is a Postgres read.
                    state
                        .auth
                        .ip_guard
                        .may_look_up()
                        .map_err(|retry_after_secs| ApiError::RateLimited { retry_after_secs })?;
                }
                let (principal, sandbox) = store_token::authenticate(state, token).await?;
                Ok((principal, Some(sandbox)))
            }
            None => Ok((authenticate(header, state, budgeted).await?, None)),
        }
    })
    .await?;
    rate_limit(&principal, state).await?;
    Ok(Caller { principal, sandbox })
}
