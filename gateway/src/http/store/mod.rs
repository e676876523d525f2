//! The store's provider-shaped routes: `/openai/v1/…` and `/anthropic/v1/…`, so that the
//! official SDKs and agent tools work by changing only their base URL. The caller's
//! SandBase key comes as `Authorization: Bearer` or (Anthropic's way) `x-api-key`; errors
//! come in the family's own shape with SandBase's stable code.

mod errors;
mod forward;
mod models;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue};
use axum::routing::{get, post};

pub use errors::{Family, StoreError};

use crate::auth::Principal;
use crate::auth::authenticate::{authenticate, rate_limit};
use crate::error::ApiError;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/openai/v1/chat/completions", post(forward::openai_chat))
        .route("/openai/v1/responses", post(forward::openai_responses))
        .route("/openai/v1/embeddings", post(forward::openai_embeddings))
        .route("/openai/v1/models", get(models::openai))
        .route("/anthropic/v1/messages", post(forward::anthropic_messages))
        .route(
            "/anthropic/v1/messages/count_tokens",
            post(forward::anthropic_count_tokens),
        )
        .route("/anthropic/v1/models", get(models::anthropic))
}

/// The caller, from `Authorization: Bearer KEY` or `x-api-key: KEY`, counted against its
/// rate limit.
async fn caller(state: &AppState, headers: &HeaderMap) -> Result<Principal, ApiError> {
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
