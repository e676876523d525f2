//! The API the tools call: a request of SandBase's public API, its answer, and the backend
//! that carries it (in process in the gateway, over HTTP in `sandbase mcp`).

use std::future::Future;

/// A call of SandBase's public API.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    pub method: http::Method,
    /// Path and query (`/v1/sandboxes/ID/files?path=%2Fwork`).
    pub path: String,
    pub body: Option<ApiBody>,
}

#[derive(Debug, Clone)]
pub enum ApiBody {
    Json(serde_json::Value),
    Bytes(Vec<u8>),
}

impl ApiRequest {
    pub fn get(path: impl Into<String>) -> ApiRequest {
        ApiRequest {
            method: http::Method::GET,
            path: path.into(),
            body: None,
        }
    }

    pub fn delete(path: impl Into<String>) -> ApiRequest {
        ApiRequest {
            method: http::Method::DELETE,
            path: path.into(),
            body: None,
        }
    }

    pub fn post(path: impl Into<String>, body: serde_json::Value) -> ApiRequest {
        ApiRequest {
            method: http::Method::POST,
            path: path.into(),
            body: Some(ApiBody::Json(body)),
        }
    }

    pub fn put_bytes(path: impl Into<String>, bytes: Vec<u8>) -> ApiRequest {
        ApiRequest {
            method: http::Method::PUT,
            path: path.into(),
            body: Some(ApiBody::Bytes(bytes)),
        }
    }
}

/// What the API answered.
#[derive(Debug, Clone)]
pub struct ApiAnswer {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl ApiAnswer {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Carries API calls for the tools. `caller` is the MCP request's HTTP head when the server
/// is reached over HTTP (its `Authorization` is the caller's key); `None` over stdio.
pub trait Backend: Send + Sync + 'static {
    fn call(
        &self,
        caller: Option<&http::request::Parts>,
        request: ApiRequest,
    ) -> impl Future<Output = Result<ApiAnswer, String>> + Send;

    /// Tools besides SandBase's own (the operator's MCP servers', named `server.tool`).
    fn extra_tools(
        &self,
        _caller: Option<&http::request::Parts>,
    ) -> impl Future<Output = Vec<rmcp::model::Tool>> + Send {
        async { Vec::new() }
    }

    /// Calls one of the [`Backend::extra_tools`]; `None` when `name` is not one.
    fn call_extra(
        &self,
        _caller: Option<&http::request::Parts>,
        _name: &str,
        _arguments: Option<rmcp::model::JsonObject>,
    ) -> impl Future<Output = Option<rmcp::model::CallToolResult>> + Send {
        async { None }
    }
}
