//! `/mcp`: SandBase's MCP server (`sandbase-mcp`) over Streamable HTTP, stateless (no
//! server-held session: any replica answers any request), JSON answers unless a tool sends
//! progress. Every request needs the caller's key (401 before the MCP layer sees it); each
//! tool is a call of the public API made in process with the request's own `Authorization`,
//! so it is authenticated, rate-limited, admitted and audited as the REST call it is.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sandbase_mcp::Sandbase;

use super::mcp_backend::InProcess;
use crate::auth::authenticate::{authenticate, rate_limit};
use crate::state::AppState;

/// The transport's checks: the public URL's host and browser origin when one is set;
/// otherwise any host and no browser origin.
fn transport_config(public_url: Option<&str>) -> StreamableHttpServerConfig {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None);
    let public = public_url.and_then(|url| url.parse::<http::Uri>().ok());
    match public
        .as_ref()
        .and_then(|uri| Some((uri.scheme_str()?, uri.authority()?)))
    {
        Some((scheme, authority)) => config
            .with_allowed_hosts([authority.as_str().to_owned(), authority.host().to_owned()])
            .with_allowed_origins([format!("{scheme}://{authority}")]),
        None => config.disable_allowed_hosts().enforce_origin_validation(),
    }
}

/// `/mcp` for the public router; `api` is that router without `/mcp` (tools call it).
pub fn router(api: Router, state: AppState) -> Router {
    let backend = Arc::new(InProcess::new(api, state.clone()));
    let service: StreamableHttpService<Sandbase<InProcess>, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(Sandbase::new(Arc::clone(&backend))),
            Arc::default(),
            transport_config(state.settings.server.public_url.as_deref()),
        );
    Router::new()
        .nest_service("/mcp", service)
        .layer(from_fn_with_state(state, gate))
}

/// Every MCP request carries the caller's key: 401 (in SandBase's error shape) otherwise,
/// before the MCP layer answers anything; it counts against the caller's rate limit.
async fn gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let authorization = request.headers().get(AUTHORIZATION).cloned();
    let ip = super::client_ip::client_ip(&request, &state.settings.server.trusted_proxies);
    let checked = async {
        let principal = super::principal::guarded(&state, ip, |budgeted| {
            authenticate(authorization.as_ref(), &state, budgeted)
        })
        .await?;
        rate_limit(&principal, &state).await
    };
    match checked.await {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}
