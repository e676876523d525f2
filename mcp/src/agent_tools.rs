//! The agent-run tools: an MCP client (Claude Code, Cursor) hands a task to a SandBase agent
//! run — on any model of the store — and follows it. Plain functions of (backend, caller,
//! parameters) like `tools.rs`'s, calling `/v1/agent-runs` through the backend; the API
//! decides who may do what (another team's run is `not_found`).

use rmcp::model::CallToolResult;
use rmcp::schemars;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::backend::{ApiRequest, Backend};
use crate::call::{Caller, Outcome, api_json};
use crate::output;

/// Events an `agent_run_events` call answers at most.
const EVENTS_PAGE: u32 = 100;
/// Characters of an event's data shown on its line.
const EVENT_LINE_CHARS: usize = 300;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AgentRunCreateParams {
    /// A model of the store (`store_models` lists them), of either family.
    pub model: String,
    /// The task: the run's first message.
    pub task: String,
    /// What the model is told first, after SandBase's own words about its sandbox.
    #[serde(default)]
    pub instructions: Option<String>,
    /// Its tools among `shell`, `files` and `python` (all three when empty).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Hosts its sandbox may reach (`pypi.org`); nothing when empty.
    #[serde(default)]
    pub egress_allow: Vec<String>,
    /// Vault credentials (names) the egress proxy adds to its sandbox's requests.
    #[serde(default)]
    pub credentials: Vec<String>,
    /// A sandbox of the team to work in (kept when the run ends); a new one when absent.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// The most the run may spend, in credits (`"0.50"`).
    #[serde(default)]
    pub max_credits: Option<String>,
    /// The most turns it may take.
    #[serde(default)]
    pub max_turns: Option<u32>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AgentRunParams {
    /// The agent run's id (from agent_run_create).
    pub run_id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AgentRunEventsParams {
    pub run_id: String,
    /// Events after this `seq` (0: from the first); the answer's `next_after` goes on.
    #[serde(default)]
    pub after: u64,
    /// Include the pieces of answers and outputs as they streamed (`model.delta`,
    /// `tool.output.delta`); left out by default.
    #[serde(default)]
    pub deltas: bool,
}

fn run_path(id: &str) -> Result<String, CallToolResult> {
    Uuid::parse_str(id.trim())
        .map(|id| format!("/v1/agent-runs/{id}"))
        .map_err(|_| {
            output::tool_error(
                400,
                "invalid_request",
                "`run_id` is not an agent run id (agent_run_create answers one)",
            )
        })
}

/// The body of `POST /v1/agent-runs` for `params`.
fn create_body(params: AgentRunCreateParams) -> Value {
    let tools: Vec<Value> = if params.tools.is_empty() {
        vec!["shell".to_owned(), "files".to_owned(), "python".to_owned()]
    } else {
        params.tools
    }
    .into_iter()
    .map(|name| json!({ "type": name }))
    .collect();
    let sandbox = match params.sandbox_id {
        Some(id) => json!({ "id": id.trim() }),
        None => json!({ "egress": { "allow": params.egress_allow },
                         "credentials": params.credentials }),
    };
    let mut limits = serde_json::Map::new();
    if let Some(credits) = params.max_credits {
        limits.insert("max_credits".to_owned(), json!(credits));
    }
    if let Some(turns) = params.max_turns {
        limits.insert("max_turns".to_owned(), json!(turns));
    }
    let mut body = json!({ "model": params.model, "input": params.task, "tools": tools,
                           "sandbox": sandbox, "limits": limits,
                           "metadata": { "via": "mcp" } });
    if let Some(instructions) = params.instructions {
        body["instructions"] = json!(instructions);
    }
    body
}

fn run_line(run: &Value) -> String {
    let text = |field: &str| run[field].as_str().unwrap_or_default().to_owned();
    let credits = run["cost_micro"].as_i64().unwrap_or_default() as f64 / 1e6;
    format!(
        "agent run {} ({}): {}, {} turn(s), {} tool call(s), {credits:.4} credits spent",
        text("id"),
        text("model"),
        text("status"),
        run["turns"].as_i64().unwrap_or_default(),
        run["tool_calls"].as_i64().unwrap_or_default(),
    )
}

pub async fn agent_run_create<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: AgentRunCreateParams,
) -> Outcome {
    let request = ApiRequest::post("/v1/agent-runs", create_body(params));
    api_json(backend, caller, request, |run| {
        format!(
            "{}\nFollow it with agent_run_events (run_id {}).",
            run_line(run),
            run["id"].as_str().unwrap_or_default()
        )
    })
    .await
}

pub async fn agent_run_get<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: AgentRunParams,
) -> Outcome {
    let path = run_path(&params.run_id)?;
    api_json(backend, caller, ApiRequest::get(path), |run| {
        let waiting = run["required_actions"]
            .as_array()
            .filter(|actions| !actions.is_empty())
            .map(|actions| format!("\nwaiting for: {}", Value::Array(actions.clone())))
            .unwrap_or_default();
        format!("{}{waiting}", run_line(run))
    })
    .await
}

pub async fn agent_run_events<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: AgentRunEventsParams,
) -> Outcome {
    let path = run_path(&params.run_id)?;
    let after = params.after;
    let request = ApiRequest::get(format!("{path}/events?after={after}&limit={EVENTS_PAGE}"));
    let deltas = params.deltas;
    api_json(backend, caller, request, |page| {
        let events = page["events"].as_array().cloned().unwrap_or_default();
        let next = events
            .last()
            .map_or(after, |event| event["seq"].as_u64().unwrap_or(after));
        let lines: Vec<String> = events
            .iter()
            .filter(|event| {
                deltas
                    || !event["type"]
                        .as_str()
                        .unwrap_or_default()
                        .ends_with(".delta")
            })
            .map(event_line)
            .collect();
        format!(
            "{} event(s) after {after}; the run is {}{}; next_after {next}\n{}",
            events.len(),
            page["status"].as_str().unwrap_or_default(),
            if page["has_more"].as_bool() == Some(true) {
                " (more to read)"
            } else {
                ""
            },
            lines.join("\n")
        )
    })
    .await
}

/// `#SEQ TYPE DATA` with the data cut at [`EVENT_LINE_CHARS`] characters.
fn event_line(event: &Value) -> String {
    let data = event["data"].to_string();
    let shown: String = data.chars().take(EVENT_LINE_CHARS).collect();
    let cut = if shown.len() < data.len() { "…" } else { "" };
    format!(
        "#{} {} {shown}{cut}",
        event["seq"].as_u64().unwrap_or_default(),
        event["type"].as_str().unwrap_or_default()
    )
}
