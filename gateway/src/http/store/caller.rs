//! Who calls the store: the SandBase key as `Authorization: Bearer` or as `x-api-key`.

use axum::http::{HeaderMap, HeaderValue};

use crate::auth::Principal;
use crate::auth::authenticate::{authenticate, rate_limit};
use crate::error::ApiError;
use crate::state::AppState;

/// The caller, from `Authorization: Bearer KEY` or `x-api-key: KEY`, counted against its
/// rate limit.
pub async fn caller(state: &AppState, headers: &HeaderMap) -> Result<Principal, ApiError> {
    let from_x_api_key = headers
        .get("x-api-key")
        .and_then(|value| value.to_str().ok())
        .and_then(|key| HeaderValue::from_str(&format!("Bearer {}", key.trim())).ok());
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .cloned()
        .or(from_x_api_key);
    let principal = authenticate(header.as_ref(), state).await?;
    rate_limit(&principal, state).await?;
    Ok(principal)
}
