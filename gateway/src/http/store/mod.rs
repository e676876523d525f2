//! The store's provider-shaped routes: `/openai/v1/…` and `/anthropic/v1/…`, so that the
//! official SDKs and agent tools work by changing only their base URL. The caller's
//! SandBase key comes as `Authorization: Bearer` or (Anthropic's way) `x-api-key`; errors
//! come in the family's own shape with SandBase's stable code.

mod apis;
mod caller;
mod errors;
pub mod forward;
mod models;

use axum::Router;
use axum::routing::{any, get, post};

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
        .route("/store/apis/{name}", any(apis::forward_root))
        .route("/store/apis/{name}/{*path}", any(apis::forward))
}
