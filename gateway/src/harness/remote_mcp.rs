//! A remote MCP server an agent run names by URL: checked at create (form, the egress guard,
//! its credential), its credential sealed by the vault for the run (a token given in the
//! request) or read from a team secret bound to its host, and reached through the guarded
//! client (resolved, checked, dialled as checked, no redirect) for each listing and call.
//! Also what a run offers of any MCP server (`Offer`), which `mcp.rs` fills and calls.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rmcp::model::{CallToolResult, JsonObject, Tool};
use sandbase_api::agent_runs::AgentTool;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::outbound::{self, Guard};
use crate::secrets::vault_error;
use crate::state::AppState;
use crate::store::mcp_servers::{self, McpFailure};

/// How long a listing or a call of a remote server may take.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Longest token given in a request.
const MAX_CREDENTIAL: usize = 4096;

/// Where a call of an offered tool goes.
pub enum Target {
    /// A store server's tool, by its name on the MCP backend (`server.tool`).
    Store(String),
    /// A remote server's tool, by its own name.
    Remote(Arc<RemoteServer>, String),
}

/// An MCP tool the run offers.
pub struct Offer {
    /// The name the model calls it by.
    pub model_name: String,
    pub target: Target,
    /// The server says it changes nothing.
    pub read_only: bool,
}

/// A run's remote server, as its tool names it.
pub fn named(index: usize, tool: &AgentTool) -> Option<Named<'_>> {
    match tool {
        AgentTool::Mcp {
            server_url: Some(url),
            server_label,
            credential,
            credential_secret,
            ..
        } => Some(Named {
            index,
            url,
            label: server_label.as_deref(),
            credential: credential.as_ref().map(|secret| secret.0.as_str()),
            credential_secret: credential_secret.as_deref(),
        }),
        _ => None,
    }
}

/// A remote server as a run's tool names it.
pub struct Named<'a> {
    pub index: usize,
    pub url: &'a str,
    pub label: Option<&'a str>,
    pub credential: Option<&'a str>,
    pub credential_secret: Option<&'a str>,
}

/// A remote server, ready to be listed and called.
pub struct RemoteServer {
    pub label: String,
    url: reqwest::Url,
    guard: Guard,
    client: reqwest::Client,
}

fn refused(code: &'static str, message: String) -> ApiError {
    ApiError::Refused {
        status: http::StatusCode::UNPROCESSABLE_ENTITY,
        code,
        message,
    }
}

/// The label a server without one goes by: its host, in the letters a tool name allows.
pub fn label_of(named: &Named<'_>) -> String {
    if let Some(label) = named.label {
        return label.to_owned();
    }
    let host = outbound::parse(named.url)
        .ok()
        .and_then(|url| url.host_str().map(str::to_owned))
        .unwrap_or_default();
    let label: String = host
        .split('.')
        .next()
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if label.is_empty() {
        "remote".to_owned()
    } else {
        label
    }
}

/// Checks a remote server at create: its URL's form and where it leads (422
/// `server_url_refused`, before any connection), its credential (one of the two; a team
/// secret must exist, be usable by the caller and be bound to the server's host).
async fn check(state: &AppState, principal: &Principal, named: &Named<'_>) -> ApiResult<()> {
    let url = outbound::parse(named.url).map_err(|why| {
        refused(
            "server_url_refused",
            format!("tools[{}].server_url: {why}", named.index),
        )
    })?;
    let guard = Guard::from_settings(&state.settings);
    guard.check_url(&url).await.map_err(|why| {
        refused(
            "server_url_refused",
            format!(
                "tools[{}].server_url: {why}; a remote MCP server must be at a public address",
                named.index
            ),
        )
    })?;
    if let Some(credential) = named.credential
        && (credential.is_empty()
            || credential.len() > MAX_CREDENTIAL
            || credential.chars().any(char::is_control))
    {
        return Err(ApiError::InvalidRequest(format!(
            "tools[{}].credential: 1 to {MAX_CREDENTIAL} bytes without control characters",
            named.index
        )));
    }
    let Some(name) = named.credential_secret else {
        return Ok(());
    };
    if named.credential.is_some() {
        return Err(ApiError::InvalidRequest(format!(
            "tools[{}]: `credential` or `credential_secret`, not both",
            named.index
        )));
    }
    crate::secrets::ensure_usable(state, principal, &[name.to_owned()]).await?;
    let (hosts, inject): Found =
        sqlx::query_as("SELECT hosts, inject FROM secrets WHERE team_id = $1 AND name = $2")
            .bind(principal.team_id)
            .bind(name)
            .fetch_one(&state.db)
            .await?;
    if inject.0.query.is_some() || inject.0.placeholder.is_some() {
        return Err(ApiError::InvalidRequest(format!(
            "tools[{}].credential_secret: the secret `{name}` is injected as a query parameter \
             or a placeholder; an MCP server takes a header (`inject.header` or `basic`)",
            named.index
        )));
    }
    if !bound_to(&hosts.0, &url) {
        return Err(refused(
            "secret_not_bound",
            format!(
                "tools[{}].credential_secret: the secret `{name}` is not bound to `{}` (its \
                 `hosts`)",
                named.index,
                url.host_str().unwrap_or_default()
            ),
        ));
    }
    Ok(())
}

type Found = (
    sqlx::types::Json<Vec<String>>,
    sqlx::types::Json<sandbase_api::secrets::Injection>,
);

/// Checks every remote server of a run's tools.
pub async fn check_all(
    state: &AppState,
    principal: &Principal,
    tools: &[AgentTool],
) -> ApiResult<()> {
    for (index, tool) in tools.iter().enumerate() {
        if let Some(named) = named(index, tool) {
            check(state, principal, &named).await?;
        }
    }
    Ok(())
}

/// Seals every token a run's tools were given (in the create transaction).
pub async fn seal_all(
    connection: &mut PgConnection,
    keyring: &sandbase_vault::Keyring,
    team_id: Uuid,
    run_id: Uuid,
    tools: &[AgentTool],
) -> ApiResult<()> {
    for (index, tool) in tools.iter().enumerate() {
        if let Some(credential) = named(index, tool).and_then(|named| named.credential) {
            seal(connection, keyring, team_id, run_id, index, credential).await?;
        }
    }
    Ok(())
}

fn bound_to(hosts: &[String], url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    let port = url.port_or_known_default().unwrap_or(443);
    hosts.iter().any(|pattern| {
        sandbase_egress::HostPattern::parse(pattern).is_ok_and(|parsed| parsed.matches(host, port))
    })
}

fn vault_label(run_id: Uuid, index: usize) -> String {
    format!("agent-run:{run_id}:mcp:{index}")
}

/// Seals a token given in the request for the run (in the create transaction).
async fn seal(
    connection: &mut PgConnection,
    keyring: &sandbase_vault::Keyring,
    team_id: Uuid,
    run_id: Uuid,
    index: usize,
    credential: &str,
) -> ApiResult<()> {
    let label = vault_label(run_id, index);
    let (nonce, sealed) =
        sandbase_vault::seal_value(connection, keyring, team_id, &label, credential.as_bytes())
            .await
            .map_err(vault_error)?;
    sqlx::query(
        "INSERT INTO agent_run_secrets (run_id, label, nonce, sealed) VALUES ($1, $2, $3, $4)",
    )
    .bind(run_id)
    .bind(&label)
    .bind(&nonce)
    .bind(&sealed)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// The headers (and query) a server's credential puts on each request.
async fn credential(
    state: &AppState,
    team_id: Uuid,
    run_id: Uuid,
    named: &Named<'_>,
    url: &reqwest::Url,
) -> Result<reqwest::header::HeaderMap, String> {
    let mut headers = reqwest::header::HeaderMap::new();
    let mut set = |name: &str, value: String| -> Result<(), String> {
        let mut value = reqwest::header::HeaderValue::from_str(&value)
            .map_err(|_| "the credential is not a header value".to_owned())?;
        value.set_sensitive(true);
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| "the secret's header is not a header name".to_owned())?;
        headers.insert(name, value);
        Ok(())
    };
    if let Some(token) = sealed(state, team_id, run_id, named.index).await? {
        set("authorization", format!("Bearer {token}"))?;
    } else if let Some(name) = named.credential_secret {
        let mut found = crate::secrets::unseal_for_sandbox(state, team_id, &[name.to_owned()])
            .await
            .map_err(|_| format!("the team secret `{name}` could not be read"))?;
        let secret = found
            .pop()
            .ok_or_else(|| format!("no team secret `{name}`"))?;
        if !bound_to(&secret.hosts, url) {
            return Err(format!(
                "the team secret `{name}` is no longer bound to this host"
            ));
        }
        let inject = &secret.inject;
        if let Some(header) = &inject.header {
            let format = inject.format.as_deref().unwrap_or("{value}");
            set(header, format.replace("{value}", &secret.value))?;
        } else if let Some(basic) = &inject.basic {
            let pair = format!("{}:{}", basic.username, secret.value);
            let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
            set("authorization", format!("Basic {encoded}"))?;
        } else {
            return Err(format!(
                "the team secret `{name}` is not injected as a header"
            ));
        }
    }
    Ok(headers)
}

/// The token given in the run's request for its tool `index`, opened (none was given: the
/// request's tools are kept without it).
async fn sealed(
    state: &AppState,
    team_id: Uuid,
    run_id: Uuid,
    index: usize,
) -> Result<Option<String>, String> {
    let label = vault_label(run_id, index);
    let mut connection = state.db.acquire().await.map_err(|e| e.to_string())?;
    let found: Option<(Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT nonce, sealed FROM agent_run_secrets WHERE run_id = $1 AND label = $2",
    )
    .bind(run_id)
    .bind(&label)
    .fetch_optional(&mut *connection)
    .await
    .map_err(|e| e.to_string())?;
    let Some((nonce, sealed)) = found else {
        return Ok(None);
    };
    let keyring = crate::secrets::keyring(state).map_err(|_| "no vault".to_owned())?;
    let opened =
        sandbase_vault::open_value(&mut connection, keyring, team_id, &label, &nonce, &sealed)
            .await
            .map_err(|_| "the run's credential could not be opened".to_owned())?;
    String::from_utf8(opened.to_vec())
        .map(Some)
        .map_err(|_| "the run's credential is not UTF-8".to_owned())
}

impl RemoteServer {
    /// The server of a run's tool, its credential opened for this gateway's calls.
    pub async fn open(
        state: &AppState,
        team_id: Uuid,
        run_id: Uuid,
        named: &Named<'_>,
    ) -> Result<RemoteServer, String> {
        let url = outbound::parse(named.url)?;
        let headers = credential(state, team_id, run_id, named, &url).await?;
        let guard = Guard::from_settings(&state.settings);
        let client = guard.client(headers).map_err(|error| error.to_string())?;
        Ok(RemoteServer {
            label: label_of(named),
            url,
            guard,
            client,
        })
    }

    fn failure(&self, failure: McpFailure) -> String {
        match failure {
            McpFailure::Timeout => format!("{} did not answer within {TIMEOUT:?}", self.label),
            McpFailure::Failed(why) => why,
        }
    }

    /// Its tools (an address in the URL is checked again first; a name is checked by the
    /// client's resolver).
    pub async fn tools(&self) -> Result<Vec<Tool>, String> {
        self.guard.check_address(&self.url)?;
        mcp_servers::list_tools(self.client.clone(), self.url.as_str(), TIMEOUT, &self.label)
            .await
            .map_err(|failure| self.failure(failure))
    }

    /// Calls its `tool`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, String> {
        self.guard.check_address(&self.url)?;
        let server = (self.url.as_str(), self.label.as_str());
        mcp_servers::call_tool(self.client.clone(), server, TIMEOUT, tool, arguments)
            .await
            .map_err(|failure| self.failure(failure))
    }
}
