//! `/mcp`: SandBase's MCP server (`sandbase-mcp`) over Streamable HTTP, stateless (no
//! server-held session: any replica answers any request), JSON answers unless a tool sends
//! progress. Every request needs the caller's key (401 before the MCP layer sees it); each
//! tool is a call of the public API made in process with the request's own `Authorization`,
//! so it is authenticated, rate-limited, admitted and audited as the REST call it is.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use rmcp::model::{CallToolResult, JsonObject, Tool};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sandbase_mcp::{ApiAnswer, ApiBody, ApiRequest, Backend, Sandbase, tool_error};
use tower::ServiceExt as _;

use super::request_id::RequestId;
use crate::auth::authenticate::{authenticate, rate_limit};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::mcp_calls::{self, Refused};
use crate::store::mcp_servers::McpFailure;

/// The public API, called in process, and the operator's MCP servers.
struct InProcess {
    api: Router,
    state: AppState,
}

impl Backend for InProcess {
    async fn call(
        &self,
        caller: Option<&http::request::Parts>,
        request: ApiRequest,
    ) -> Result<ApiAnswer, String> {
        let mut builder = http::Request::builder()
            .method(request.method)
            .uri(request.path);
        if let Some(authorization) = caller.and_then(|parts| parts.headers.get(AUTHORIZATION)) {
            builder = builder.header(AUTHORIZATION, authorization);
        }
        let body = match request.body {
            None => Body::empty(),
            Some(ApiBody::Json(value)) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                Body::from(serde_json::to_vec(&value).map_err(|error| error.to_string())?)
            }
            Some(ApiBody::Bytes(bytes)) => {
                builder = builder.header(CONTENT_TYPE, "application/octet-stream");
                Body::from(bytes)
            }
        };
        let mut inner = builder.body(body).map_err(|error| error.to_string())?;
        // The caller's address and request id go along: audit rows and limits see the
        // client, not the gateway.
        if let Some(parts) = caller {
            if let Some(peer) = parts.extensions.get::<ConnectInfo<SocketAddr>>() {
                inner.extensions_mut().insert(*peer);
            }
            if let Some(id) = parts.extensions.get::<RequestId>() {
                inner.extensions_mut().insert(id.clone());
            }
        }
        let Ok(response) = self.api.clone().oneshot(inner).await;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(|value| value.split(';').next().unwrap_or(value).trim().to_owned());
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|error| format!("reading the answer: {error}"))?
            .to_bytes()
            .to_vec();
        Ok(ApiAnswer {
            status,
            content_type,
            body,
        })
    }

    async fn extra_tools(&self, _caller: Option<&http::request::Parts>) -> Vec<Tool> {
        let mut tools = Vec::new();
        for server in &self.state.store.mcp_servers {
            match server.tools().await {
                Ok(listed) => tools.extend(listed.into_iter().map(|mut tool| {
                    tool.name = format!("{}.{}", server.settings.name, tool.name).into();
                    tool
                })),
                Err(error) => tracing::warn!(
                    server = %server.settings.name, error = ?error,
                    "an MCP server's tools could not be listed"
                ),
            }
        }
        tools
    }

    async fn call_extra(
        &self,
        caller: Option<&http::request::Parts>,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Option<CallToolResult> {
        let (server, tool) = name.split_once('.')?;
        let server = self
            .state
            .store
            .mcp_servers
            .iter()
            .find(|candidate| candidate.settings.name == server)?;
        let authorization = caller.and_then(|parts| parts.headers.get(AUTHORIZATION));
        let principal = match authenticate(authorization, &self.state).await {
            Ok(principal) => principal,
            Err(error) => return Some(refusal(&error)),
        };
        let called = mcp_calls::call(&self.state, &principal, server, tool, arguments).await;
        Some(match called {
            Ok(result) => result,
            Err(Refused::Api(error)) => refusal(&error),
            Err(Refused::Upstream(McpFailure::Timeout)) => tool_error(
                504,
                "upstream_timeout",
                &format!(
                    "{} did not answer within {} s (not billed)",
                    server.settings.name, server.settings.timeout_secs
                ),
            ),
            Err(Refused::Upstream(McpFailure::Failed(why))) => {
                tool_error(502, "upstream_failed", &format!("{why} (not billed)"))
            }
        })
    }
}

/// An API error as a tool error with SandBase's code.
fn refusal(error: &ApiError) -> CallToolResult {
    tool_error(
        error.status_code().as_u16(),
        error.code(),
        &error.to_string(),
    )
}

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
    let backend = Arc::new(InProcess {
        api,
        state: state.clone(),
    });
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
    let checked = async {
        let principal = authenticate(authorization.as_ref(), &state).await?;
        rate_limit(&principal, &state).await
    };
    match checked.await {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}
