//! The first thing done with a request: its address's rate ([`crate::ip_guard`]), checked in
//! memory before any authentication, database or Redis work.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

pub async fn middleware(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(ip) = super::client_ip::client_ip(&request, &state.settings.server.trusted_proxies)
        && let Err(retry_after_secs) = state.auth.ip_guard.admit_request(ip)
    {
        metrics::counter!("sandbase_ip_limited_total").increment(1);
        return ApiError::RateLimited { retry_after_secs }.into_response();
    }
    next.run(request).await
}
