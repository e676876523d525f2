//! A call of an operator's MCP server's tool for a caller: admitted first (the server's
//! price per call reserved against the team's credits and the key's caps, as any store
//! call), forwarded with the operator's credential, then booked once (a `store_requests` row
//! of kind `api`, its debit) and audited with the caller as actor. A server that is down or
//! slower than its `timeout_secs` costs nothing: the reservation is given back.

use rmcp::model::{CallToolResult, JsonObject};

use super::mcp_servers::{McpFailure, McpServer};
use super::meter::{self, Asked, Kind, Settled};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::state::AppState;

/// Why a call has no result.
pub enum Refused {
    /// Not admitted (credits, caps).
    Api(ApiError),
    Upstream(McpFailure),
}

pub async fn call(
    state: &AppState,
    principal: &Principal,
    server: &McpServer,
    tool: &str,
    arguments: Option<JsonObject>,
) -> Result<CallToolResult, Refused> {
    let asked = Asked {
        kind: Kind::Api,
        name: &server.settings.name,
        listed_as: format!("mcp:{}", server.settings.name),
        endpoint: format!("tools/call {}", tool.chars().take(128).collect::<String>()),
        streamed: false,
        hold_for: std::time::Duration::from_secs(server.settings.timeout_secs),
        sandbox: None,
    };
    let call = meter::admit(state, principal, asked, server.per_call)
        .await
        .map_err(Refused::Api)?;
    let answered = server.call(tool, arguments).await;
    audit(state, principal, server, tool, answered.as_ref().err()).await;
    match answered {
        Ok(result) => {
            let settled = Settled {
                status: 200,
                usage: Default::default(),
                cost: server.per_call,
                estimated: false,
                first_byte: None,
                bytes: 0,
            };
            if let Err(error) = meter::book(state, call, settled).await {
                tracing::error!(error = format!("{error:#}"), "booking an MCP tool call");
            }
            Ok(result)
        }
        Err(failure) => {
            meter::release(state, &call).await;
            Err(Refused::Upstream(failure))
        }
    }
}

async fn audit(
    state: &AppState,
    principal: &Principal,
    server: &McpServer,
    tool: &str,
    failure: Option<&McpFailure>,
) {
    let entry = crate::audit::Entry {
        team_id: Some(principal.team_id),
        actor_type: principal.actor_type(),
        actor_id: Some(principal.actor_id()),
        action: "mcp.tool_call".to_owned(),
        target: Some(format!("mcp:{}.{tool}", server.settings.name)),
        outcome: if failure.is_none() {
            "success"
        } else {
            "failure"
        },
        status_code: Some(match failure {
            None => 200,
            Some(McpFailure::Timeout) => 504,
            Some(McpFailure::Failed(_)) => 502,
        }),
        details: serde_json::json!({
            "server": server.settings.name,
            "tool": tool,
            "credits_micro": if failure.is_none() { server.per_call } else { 0 },
        }),
    };
    let written = async {
        let mut connection = state.db.acquire().await?;
        crate::audit::insert(&mut connection, &entry, None, None).await
    };
    if let Err(error) = written.await {
        tracing::error!(error = %error, "auditing an MCP tool call");
    }
}
