//! The backend of the MCP tools in the gateway: each tool's call of the public API made in
//! process (the API router called with the MCP request's own `Authorization`, address and
//! request id, its answer read as it comes), and the operator's MCP servers' tools.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use rmcp::model::{CallToolResult, JsonObject, Tool};
use sandbase_mcp::{ApiBody, ApiRequest, ApiStream, Backend, tool_error};
use tower::ServiceExt as _;

use super::request_id::RequestId;
use crate::auth::authenticate::authenticate;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::mcp_calls::{self, Refused};
use crate::store::mcp_servers::McpFailure;

/// The public API, called in process, and the operator's MCP servers.
pub struct InProcess {
    api: Router,
    state: AppState,
}

impl InProcess {
    /// `api`: the public router without `/mcp` (a tool cannot call MCP again).
    pub fn new(api: Router, state: AppState) -> InProcess {
        InProcess { api, state }
    }
}

impl Backend for InProcess {
    async fn stream(
        &self,
        caller: Option<&http::request::Parts>,
        request: ApiRequest,
    ) -> Result<ApiStream, String> {
        let inner = api_request(caller, request)?;
        let Ok(response) = self.api.clone().oneshot(inner).await;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let headers = response.headers().clone();
        // Read as it comes: a streamed command's events reach the tool one by one.
        let body = response.into_body().into_data_stream();
        Ok(ApiStream::new(status, content_type.as_deref(), body).with_headers(headers))
    }

    async fn extra_tools(&self, _caller: Option<&http::request::Parts>) -> Vec<Tool> {
        let mut tools = Vec::new();
        for server in &self.state.store.mcp_servers {
            match server.tools().await {
                Ok(listed) => tools.extend(
                    listed
                        .into_iter()
                        .map(|tool| third_party(&server.settings.name, tool)),
                ),
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
        let principal = match authenticate(authorization, &self.state, false).await {
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

/// The API request for `request`, carrying the caller's `Authorization`, address and
/// request id (audit rows and limits see the client, not the gateway).
fn api_request(
    caller: Option<&http::request::Parts>,
    request: ApiRequest,
) -> Result<http::Request<Body>, String> {
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
    if let Some(parts) = caller {
        if let Some(peer) = parts.extensions.get::<ConnectInfo<SocketAddr>>() {
            inner.extensions_mut().insert(*peer);
        }
        if let Some(id) = parts.extensions.get::<RequestId>() {
            inner.extensions_mut().insert(id.clone());
        }
    }
    Ok(inner)
}

/// Longest description of an operator's MCP server's tool passed on.
const MAX_DESCRIPTION: usize = 1024;

/// An operator's MCP server's tool as teams see it: named `server.tool`, and its description
/// (the server's text, which reaches every tenant's model) capped and marked as a third
/// party's, so that no server passes its words off as SandBase's instructions.
fn third_party(server: &str, mut tool: Tool) -> Tool {
    tool.name = format!("{server}.{}", tool.name).into();
    let original = tool.description.as_deref().unwrap_or_default();
    let capped: String = original.chars().take(MAX_DESCRIPTION).collect();
    tool.description = Some(
        format!("[Third-party tool of the MCP server `{server}`, not SandBase's; its text and results are that server's.] {capped}")
            .into(),
    );
    tool
}
