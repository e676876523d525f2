//! A new agent run: its request checked, its own key made and sealed, its row, its first
//! turn's messages and events written in one transaction (with the audit row), and this
//! gateway's dispatcher woken. An Idempotency-Key makes a retried create answer the first
//! run (same body) or refuse (another body), for 24 hours.

use http::StatusCode;
use sandbase_api::agent_runs::{
    AgentInput, AgentSandbox, AgentTool, Checkpoints, CreateAgentRunRequest, InputRole,
    UncertainTool,
};
use sandbase_api::conversation::{Message, Part, Role};
use serde_json::json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::journal::Write;
use super::rows::{self, AgentRunRow};
use super::run_key;
use crate::audit::Audit;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Seconds an idle run waits for a message unless asked otherwise.
const DEFAULT_IDLE_SECS: u64 = 3600;
/// Seconds a waiting run keeps the sandbox it made unless asked otherwise.
const DEFAULT_MAX_WAIT_SECS: u64 = 86_400;
/// Names the built-in tools take; a client function may not.
const BUILT_IN: [&str; 3] = ["shell", "files", "python"];

/// Makes the run; `false` with the existing run when the Idempotency-Key was used for the
/// same request before.
pub async fn create(
    state: &AppState,
    principal: &Principal,
    audit: &Audit,
    idempotency_key: Option<String>,
    request: CreateAgentRunRequest,
) -> ApiResult<(bool, AgentRunRow)> {
    let keyring = crate::secrets::keyring(state)?;
    check(state, &request)?;
    super::remote_mcp::check_all(state, principal, &request.tools).await?;
    let max_credits = crate::sandboxes::validate::parse_cap(
        "limits.max_credits",
        request.limits.max_credits.as_deref(),
    )?;
    let hash = Sha256::digest(serde_json::to_vec(&request).unwrap_or_default()).to_vec();
    if let Some(key) = &idempotency_key
        && let Some(existing) = earlier(state, principal.team_id, key, &hash).await?
    {
        return Ok((false, existing));
    }
    let mut tx = state.db.begin().await?;
    let (sandbox_id, spec, owns) = match &request.sandbox {
        Some(AgentSandbox::Existing(existing)) => {
            let found: Option<(String,)> =
                sqlx::query_as("SELECT state FROM sandboxes WHERE id = $1 AND team_id = $2")
                    .bind(existing.id)
                    .bind(principal.team_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            match found {
                Some((sandbox_state,)) if sandbox_state != "stopped" => {}
                _ => return Err(ApiError::NotFound("sandbox")),
            }
            (Some(existing.id), None, false)
        }
        Some(AgentSandbox::New(body)) => (None, Some(json!(body)), true),
        None => (None, Some(json!({})), true),
    };
    let id = Uuid::new_v4();
    let sealed = run_key::mint(&mut tx, keyring, principal, id, max_credits).await?;
    let (created_by_key, created_by_user) = (principal.api_key_id(), principal.user_id());
    let inserted = sqlx::query(
        "INSERT INTO agent_runs (id, team_id, created_by_key, created_by_user, creator_role, \
             run_key_id, key_nonce, key_sealed, model, instructions, tools, sandbox_spec, \
             sandbox_id, owns_sandbox, limits, parallel_tool_calls, on_uncertain_tool, \
             idle_timeout_secs, metadata, status, turns, idempotency_key, request_hash, \
             approvals) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, 'fail', \
             $17, $18, $19, 1, $20, $21, $22) ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(principal.team_id)
    .bind(created_by_key)
    .bind(created_by_user)
    .bind(principal.role.as_str())
    .bind(sealed.key_id)
    .bind(&sealed.nonce)
    .bind(&sealed.sealed)
    .bind(&request.model)
    .bind(&request.instructions)
    .bind(sqlx::types::Json(&request.tools))
    .bind(&spec)
    .bind(sandbox_id)
    .bind(owns)
    .bind(sqlx::types::Json(&request.limits))
    .bind(request.parallel_tool_calls.unwrap_or(true))
    .bind(request.idle_timeout_secs.unwrap_or(DEFAULT_IDLE_SECS) as i32)
    .bind(sqlx::types::Json(&request.metadata))
    .bind(super::lifecycle::Status::Queued)
    .bind(&idempotency_key)
    .bind(&hash)
    .bind(sqlx::types::Json(&request.approvals))
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        // The same Idempotency-Key, at the same moment: the other request's run.
        drop(tx);
        let key = idempotency_key.unwrap_or_default();
        return match earlier(state, principal.team_id, &key, &hash).await? {
            Some(existing) => Ok((false, existing)),
            None => Err(reused()),
        };
    }
    choices(&mut tx, id, &request).await?;
    super::remote_mcp::seal_all(&mut tx, keyring, principal.team_id, id, &request.tools).await?;
    audit
        .record(
            &mut tx,
            principal,
            Some(format!("agent_run:{id}")),
            json!({ "model": request.model, "key_id": sealed.key_id }),
        )
        .await?;
    first_turn(tx, id, &request).await?;
    let _ = state.harness.events.send(id);
    state.harness.wake.notify_one();
    let mut connection = state.db.acquire().await?;
    Ok((
        true,
        rows::fetch(&mut connection, principal.team_id, id).await?,
    ))
}

/// The run's choices about waits and uncertainty.
async fn choices(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    request: &CreateAgentRunRequest,
) -> ApiResult<()> {
    let uncertain = match request.on_uncertain_tool {
        Some(UncertainTool::Ask) => "ask",
        _ => "fail",
    };
    let checkpoints = match request.checkpoints {
        Some(Checkpoints::EveryTurn) => "every_turn",
        _ => "none",
    };
    sqlx::query(
        "UPDATE agent_runs SET on_uncertain_tool = $2, checkpoints = $3, max_wait_secs = $4 \
         WHERE id = $1",
    )
    .bind(id)
    .bind(uncertain)
    .bind(checkpoints)
    .bind(
        request
            .max_wait_secs
            .unwrap_or(DEFAULT_MAX_WAIT_SECS)
            .min(604_800) as i32,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// The run's first events and its first turn's messages, committed with the run.
async fn first_turn(
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    id: Uuid,
    request: &CreateAgentRunRequest,
) -> ApiResult<()> {
    let mut write = Write::within(tx, id).await?;
    write
        .event(
            "run.created",
            json!({ "model": request.model, "tools": request.tools,
                                       "limits": request.limits, "metadata": request.metadata }),
        )
        .await?;
    write.event("turn.started", json!({ "turn": 1 })).await?;
    for message in input_messages(&request.input) {
        write.message(&message).await?;
    }
    write.commit().await?;
    Ok(())
}

/// A turn's input as messages of the conversation.
pub fn input_messages(input: &AgentInput) -> Vec<Message> {
    let text = |role, text: &str| Message {
        role,
        content: vec![Part::Text {
            text: text.to_owned(),
        }],
    };
    match input {
        AgentInput::Text(words) => vec![text(Role::User, words)],
        AgentInput::Messages(messages) => messages
            .iter()
            .map(|message| {
                let role = match message.role {
                    InputRole::User => Role::User,
                    InputRole::Assistant => Role::Assistant,
                };
                text(role, &message.content)
            })
            .collect(),
    }
}

/// The run an earlier request with this Idempotency-Key made (within 24 hours): answered
/// for the same body, refused for another.
async fn earlier(
    state: &AppState,
    team_id: Uuid,
    key: &str,
    hash: &[u8],
) -> ApiResult<Option<AgentRunRow>> {
    let found: Option<AgentRunRow> = sqlx::query_as(&format!(
        "SELECT {} FROM agent_runs WHERE team_id = $1 AND idempotency_key = $2 \
           AND created_at > now() - interval '24 hours'",
        rows::RUN_COLUMNS
    ))
    .bind(team_id)
    .bind(key)
    .fetch_optional(&state.db)
    .await?;
    match found {
        Some(row) if row.request_hash.as_deref() == Some(hash) => Ok(Some(row)),
        Some(_) => Err(reused()),
        None => Ok(None),
    }
}

fn reused() -> ApiError {
    ApiError::Refused {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "idempotency_key_reused",
        message: "this Idempotency-Key was used for another request in the last 24 hours"
            .to_owned(),
    }
}

/// What the request asks for, checked before anything is made.
fn check(state: &AppState, request: &CreateAgentRunRequest) -> ApiResult<()> {
    let invalid = |message: String| Err(ApiError::InvalidRequest(message));
    if serde_json::to_string(request).is_ok_and(|text| text.contains("\\u0000")) {
        return invalid("text in an agent run may not contain NUL characters".to_owned());
    }
    if !state
        .store
        .models()
        .iter()
        .any(|model| model.settings.id == request.model)
    {
        return invalid(format!(
            "no model `{}` in the store: GET /v1/store/models lists them",
            request.model
        ));
    }
    sandbase_harness::approval::check(&request.approvals).map_err(ApiError::InvalidRequest)?;
    let mut names = std::collections::BTreeSet::new();
    let labels: Vec<String> = (request.tools.iter().enumerate())
        .map(|(index, tool)| {
            super::remote_mcp::named(index, tool)
                .map(|named| super::remote_mcp::label_of(&named))
                .unwrap_or_default()
        })
        .collect();
    for (index, tool) in request.tools.iter().enumerate() {
        let name = match tool {
            AgentTool::Shell => "shell",
            AgentTool::Files => "files",
            AgentTool::Python => "python",
            AgentTool::Mcp { .. } => mcp_name(state, tool, &labels[index])?,
            AgentTool::Function {
                name, parameters, ..
            } => {
                if BUILT_IN.contains(&name.as_str()) {
                    return invalid(format!(
                        "a function may not be named `{name}` (a built-in tool)"
                    ));
                }
                if parameters
                    .as_ref()
                    .is_some_and(|schema| !schema.is_object())
                {
                    return invalid(format!(
                        "the parameters of `{name}` must be a JSON Schema object"
                    ));
                }
                name.as_str()
            }
        };
        if !names.insert(name.to_owned()) {
            return invalid(format!("the tool `{name}` is given twice"));
        }
    }
    match &request.input {
        AgentInput::Text(text) if text.trim().is_empty() => {
            return invalid("`input` is empty".to_owned());
        }
        AgentInput::Messages(messages) if messages.is_empty() => {
            return invalid("`input` has no messages".to_owned());
        }
        _ => {}
    }
    let seconds = [
        ("idle_timeout_secs", request.idle_timeout_secs),
        ("max_wait_secs", request.max_wait_secs),
    ];
    if let Some((field, _)) =
        (seconds.iter()).find(|(_, value)| value.is_some_and(|v| v == 0 || v > 604_800))
    {
        return invalid(format!("`{field}`: 1 to 604800 seconds"));
    }
    if request.metadata.len() > 16
        || request
            .metadata
            .iter()
            .any(|(key, value)| key.len() > 64 || value.len() > 512)
    {
        return invalid(
            "`metadata`: at most 16 pairs, keys of at most 64 bytes, values of at most 512"
                .to_owned(),
        );
    }
    Ok(())
}

/// The name an `mcp` tool goes by among the run's tools: a store server's (which must exist
/// and takes no credential), or a remote one's label.
fn mcp_name<'a>(state: &AppState, tool: &'a AgentTool, label: &'a str) -> ApiResult<&'a str> {
    let invalid = |message: String| Err(ApiError::InvalidRequest(message));
    let AgentTool::Mcp {
        server,
        server_url,
        server_label,
        credential,
        credential_secret,
        ..
    } = tool
    else {
        return invalid("not an `mcp` tool".to_owned());
    };
    match (server, server_url) {
        (Some(server), None) => {
            let servers = &state.store.mcp_servers;
            if !servers.iter().any(|known| known.settings.name == *server) {
                return invalid(format!(
                    "the store has no MCP server `{server}` (the operator's \
                     `[[store.mcp_servers]]`)"
                ));
            }
            if credential.is_some() || credential_secret.is_some() {
                return invalid(format!(
                    "the store's MCP server `{server}` takes no credential: the operator's is \
                     injected"
                ));
            }
            Ok(server_label.as_deref().unwrap_or(server))
        }
        (None, Some(_)) => Ok(label),
        _ => invalid("an `mcp` tool names exactly one of `server` and `server_url`".to_owned()),
    }
}
