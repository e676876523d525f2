//! The operator's MCP servers: their tools, offered on `/mcp` as `{server}.{tool}`, and
//! calls of them with the operator's credential (the team never holds it). Each use opens a
//! client session of its own (initialize, the request, close), bounded by the server's
//! `timeout_secs`; a server's tool list is kept a minute.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rmcp::ServiceExt as _;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use secrecy::ExposeSecret as _;

use crate::config::{Injection, McpServerSettings};

/// How long a server's tool list is reused.
const TOOLS_TTL: Duration = Duration::from_secs(60);

/// An operator's MCP server with its credential (in its client's default headers, the
/// client made again when the credential changes) and price.
pub struct McpServer {
    pub settings: McpServerSettings,
    /// Micro-credits per call.
    pub per_call: i64,
    credential: Arc<super::credential::Credential>,
    /// The client, and the credential's version it was made with.
    client: Mutex<(u64, reqwest::Client)>,
    tools: Mutex<Option<(Instant, Vec<Tool>)>>,
}

/// Why a call did not come back.
#[derive(Debug)]
pub enum McpFailure {
    /// Not within the server's `timeout_secs`.
    Timeout,
    /// Unreachable, or it answered something else than a result.
    Failed(String),
}

impl McpServer {
    /// `key` names it in the configuration, for errors.
    pub fn new(
        key: &str,
        settings: &McpServerSettings,
        credential: Arc<super::credential::Credential>,
    ) -> anyhow::Result<McpServer> {
        let client = client(settings, credential.get())
            .with_context(|| format!("key `{key}`: the credential"))?;
        Ok(McpServer {
            per_call: sandbase_billing::Credits::parse(&settings.price_per_call)
                .map_or(0, |credits| credits.0),
            settings: settings.clone(),
            client: Mutex::new((credential.version(), client)),
            credential,
            tools: Mutex::new(None),
        })
    }

    /// The client with the credential as it is now.
    fn current_client(&self) -> Result<reqwest::Client, String> {
        let mut held = self.client.lock().unwrap_or_else(|p| p.into_inner());
        let version = self.credential.version();
        if held.0 != version {
            let fresh = client(&self.settings, self.credential.get())
                .map_err(|error| format!("{}: {error:#}", self.settings.name))?;
            *held = (version, fresh);
        }
        Ok(held.1.clone())
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.settings.timeout_secs)
    }

    /// Its tools (from the last minute's listing when there is one).
    pub async fn tools(&self) -> Result<Vec<Tool>, McpFailure> {
        if let Some((at, tools)) = &*self.tools.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < TOOLS_TTL
        {
            return Ok(tools.clone());
        }
        let client = self.current_client().map_err(McpFailure::Failed)?;
        let listed = list_tools(
            client,
            &self.settings.url,
            self.timeout(),
            &self.settings.name,
        )
        .await?;
        *self.tools.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), listed.clone()));
        Ok(listed)
    }

    /// Calls `tool` with `arguments`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, McpFailure> {
        let client = self.current_client().map_err(McpFailure::Failed)?;
        let server = (self.settings.url.as_str(), self.settings.name.as_str());
        call_tool(client, server, self.timeout(), tool, arguments).await
    }
}

/// A client session with the Streamable HTTP server at `url` through `client`.
async fn session(
    client: reqwest::Client,
    url: &str,
    name: &str,
) -> Result<RunningService<RoleClient, ()>, String> {
    let transport = StreamableHttpClientTransport::with_client(
        client,
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()),
    );
    ().serve(transport)
        .await
        .map_err(|error| format!("{name}: {error}"))
}

/// The tools of the MCP server at `url` (called `name` in errors), in a session of its own.
pub async fn list_tools(
    client: reqwest::Client,
    url: &str,
    timeout: Duration,
    name: &str,
) -> Result<Vec<Tool>, McpFailure> {
    tokio::time::timeout(timeout, async {
        let session = session(client, url, name).await?;
        let tools = session.peer().list_all_tools().await;
        let _ = session.cancel().await;
        tools.map_err(|error| format!("{name}: {error}"))
    })
    .await
    .map_err(|_| McpFailure::Timeout)?
    .map_err(McpFailure::Failed)
}

/// Calls `tool` of the MCP server `(url, name)` with `arguments`, in a session of its own.
pub async fn call_tool(
    client: reqwest::Client,
    (url, name): (&str, &str),
    timeout: Duration,
    tool: &str,
    arguments: Option<JsonObject>,
) -> Result<CallToolResult, McpFailure> {
    let mut request = CallToolRequestParams::new(tool.to_owned());
    if let Some(arguments) = arguments {
        request = request.with_arguments(arguments);
    }
    tokio::time::timeout(timeout, async {
        let session = session(client, url, name).await?;
        let result = session.peer().call_tool(request).await;
        let _ = session.cancel().await;
        result.map_err(|error| format!("{name}: {error}"))
    })
    .await
    .map_err(|_| McpFailure::Timeout)?
    .map_err(McpFailure::Failed)
}

/// A client whose every request carries `credential` as the server's settings say.
fn client(
    settings: &McpServerSettings,
    credential: Option<secrecy::SecretString>,
) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(credential) = credential {
        // Validated at start-up: an MCP server's credential is a bearer token or a header.
        let (name, value) = match &settings.inject {
            Injection::Header(name) => (name.clone(), credential.expose_secret().to_owned()),
            Injection::Bearer | Injection::Query(_) => (
                "authorization".to_owned(),
                format!("Bearer {}", credential.expose_secret()),
            ),
        };
        let mut value = reqwest::header::HeaderValue::from_str(&value)
            .context("the credential is not a header value")?;
        value.set_sensitive(true);
        headers.insert(
            reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .context("`inject` does not name a header")?,
            value,
        );
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        // A 3xx is an error of the server, never followed with the operator's credential.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .context("building an MCP server's HTTP client")
}
