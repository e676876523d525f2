//! The API the tools call: a request of SandBase's public API, its answer, and the backend
//! that carries it (in process in the gateway, over HTTP in `sandbase mcp`).

use std::future::Future;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;

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

/// The most of an answer a backend collects whole (a file read, a listing); beyond it the
/// answer is cut off and marked `truncated`, so no answer can fill the caller's memory.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// The longest a backend waits for an answer it collects whole.
pub const COLLECT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// What the API answered, collected whole (at most [`MAX_ANSWER_BYTES`] of it).
#[derive(Debug, Clone)]
pub struct ApiAnswer {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    /// The answer was longer than [`MAX_ANSWER_BYTES`]: `body` is its beginning.
    pub truncated: bool,
    /// Its headers, where the backend passes them on (`Retry-After`, the store's request id).
    pub headers: http::HeaderMap,
}

impl ApiAnswer {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

/// What the API answers, as it comes (a streamed command's NDJSON events, say).
pub struct ApiStream {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: BoxStream<'static, Result<Vec<u8>, String>>,
    pub headers: http::HeaderMap,
}

impl ApiStream {
    /// An answer of `status` whose `Content-Type` header is `content_type` (its media type
    /// kept, parameters dropped) and whose body comes as `chunks`.
    pub fn new<S, B, E>(status: u16, content_type: Option<&str>, chunks: S) -> ApiStream
    where
        S: futures_util::Stream<Item = Result<B, E>> + Send + 'static,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        let content_type =
            content_type.map(|value| value.split(';').next().unwrap_or(value).trim().to_owned());
        let body = chunks
            .map(|chunk| {
                chunk
                    .map(|bytes| bytes.as_ref().to_vec())
                    .map_err(|error| format!("reading the answer: {error}"))
            })
            .boxed();
        ApiStream {
            status,
            content_type,
            body,
            headers: http::HeaderMap::new(),
        }
    }

    /// The same answer, with the headers it came with.
    pub fn with_headers(mut self, headers: http::HeaderMap) -> ApiStream {
        self.headers = headers;
        self
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The answer whole: at most [`MAX_ANSWER_BYTES`] of it, within [`COLLECT_DEADLINE`].
    /// Past the cap the rest is not read (the stream is dropped, which ends the request): an
    /// endless answer (`/dev/zero`) costs the cap and no more.
    pub async fn collect(self) -> Result<ApiAnswer, String> {
        let ApiStream {
            status,
            content_type,
            mut body,
            headers,
        } = self;
        let mut kept = Vec::new();
        let mut truncated = false;
        let reading = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk?;
                let room = MAX_ANSWER_BYTES - kept.len();
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if chunk.len() > room {
                    truncated = true;
                    break;
                }
            }
            Ok::<(), String>(())
        };
        match tokio::time::timeout(COLLECT_DEADLINE, reading).await {
            Ok(read) => read?,
            Err(_) => {
                return Err(format!(
                    "the answer did not come whole within {} s",
                    COLLECT_DEADLINE.as_secs()
                ));
            }
        }
        Ok(ApiAnswer {
            status,
            content_type,
            body: kept,
            truncated,
            headers,
        })
    }
}

/// Carries API calls for the tools. `caller` is the MCP request's HTTP head when the server
/// is reached over HTTP (its `Authorization` is the caller's key); `None` over stdio.
pub trait Backend: Send + Sync + 'static {
    /// A call whose answer is read as it comes.
    fn stream(
        &self,
        caller: Option<&http::request::Parts>,
        request: ApiRequest,
    ) -> impl Future<Output = Result<ApiStream, String>> + Send;

    /// A call whose answer is collected whole (capped at [`MAX_ANSWER_BYTES`]).
    fn call(
        &self,
        caller: Option<&http::request::Parts>,
        request: ApiRequest,
    ) -> impl Future<Output = Result<ApiAnswer, String>> + Send {
        async move { self.stream(caller, request).await?.collect().await }
    }

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
