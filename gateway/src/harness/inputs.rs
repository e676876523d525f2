//! What is sent to a run: a message (the next turn's input — at once when the run is idle,
//! queued for the turn's end when one is going on), a client function's result (the run goes
//! on when none is missing any more), a cancel. Each is written under the run's row lock,
//! so its event takes the next `seq` like the loop's own; an Idempotency-Key makes a retry
//! answer without sending it twice.

use http::StatusCode;
use sandbase_api::Role as TeamRole;
use sandbase_api::agent_runs::{AgentRunInput, CancelScope, Remember, RequiredAction};
use sandbase_api::conversation::{Message, Part, Role, ToolResult};
use serde_json::{Value, json};
use sqlx::PgConnection;
use uuid::Uuid;

use super::journal::Write;
use super::lifecycle::{self, Status};
use super::rows::{self, AgentRunRow};
use super::run::DEFAULT_MAX_TURNS;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

fn refused(status: StatusCode, code: &'static str, message: String) -> ApiError {
    ApiError::Refused {
        status,
        code,
        message,
    }
}

fn finished(row: &AgentRunRow) -> ApiError {
    refused(
        StatusCode::CONFLICT,
        "agent_run_finished",
        format!("this agent run is {}; it takes nothing more", row.status),
    )
}

/// Sends `input` to the run `id` of `principal`'s team.
pub async fn send(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
    input: AgentRunInput,
    idempotency_key: Option<String>,
) -> ApiResult<AgentRunRow> {
    let mut connection = state.db.acquire().await?;
    rows::fetch(&mut connection, principal.team_id, id).await?;
    drop(connection);
    if serde_json::to_string(&input).is_ok_and(|text| text.contains("\\u0000")) {
        return Err(ApiError::InvalidRequest(
            "an input may not contain NUL characters".to_owned(),
        ));
    }
    let mut write = Write::unleased(&state.db, id).await?;
    let row = rows::load(&mut write.tx, id).await?;
    if row.status.is_final() {
        return Err(finished(&row));
    }
    let kind = match &input {
        AgentRunInput::Message { .. } => "message",
        AgentRunInput::ToolResult { .. } => "tool_result",
        AgentRunInput::Approval { .. } => {
            may_decide(&mut write.tx, principal, &row).await?;
            "approval"
        }
        AgentRunInput::Limits { .. } => {
            may_decide(&mut write.tx, principal, &row).await?;
            "limits"
        }
    };
    let recorded: Option<(Uuid,)> = sqlx::query_as(
        "INSERT INTO agent_run_inputs (id, run_id, kind, body, idempotency_key, taken) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(Uuid::new_v4())
    .bind(id)
    .bind(kind)
    .bind(sqlx::types::Json(&input))
    .bind(&idempotency_key)
    .bind(kind != "message" || row.status == Status::Idle)
    .fetch_optional(&mut *write.tx)
    .await?;
    if recorded.is_none() {
        // Sent before with this Idempotency-Key: answered, not sent again.
        return Ok(row);
    }
    let new_limits = matches!(input, AgentRunInput::Limits { .. });
    let wake = match input {
        AgentRunInput::Message { content } => message(&mut write, &row, content).await?,
        AgentRunInput::ToolResult {
            call_id,
            output,
            is_error,
        } => {
            let result = ToolResult {
                call_id,
                content: output,
                is_error,
            };
            tool_result(&mut write, &row, result).await?
        }
        AgentRunInput::Approval {
            call_id,
            decision,
            reason,
            remember,
        } => {
            let decision = json!({ "call_id": call_id, "decision": decision, "reason": reason,
                                   "remember": remember.unwrap_or(Remember::Call),
                                   "by": principal.actor_id() });
            approval(&mut write, &row, decision).await?
        }
        AgentRunInput::Limits { limits } => super::limits::raise(&mut write, &row, limits).await?,
    };
    write.commit().await?;
    if new_limits {
        super::limits::forget_caps(state, &row).await;
    }
    let _ = state.harness.events.send(id);
    if wake {
        state.harness.wake.notify_one();
    }
    let mut connection = state.db.acquire().await?;
    Ok(rows::load(&mut connection, id).await?)
}

async fn message(write: &mut Write, row: &AgentRunRow, content: String) -> ApiResult<bool> {
    let text = Message {
        role: Role::User,
        content: vec![Part::Text { text: content }],
    };
    if row.status != Status::Idle {
        write
            .event(
                "input.received",
                json!({ "type": "message", "queued": true }),
            )
            .await?;
        return Ok(false);
    }
    let max_turns = row.limits.0.max_turns.unwrap_or(DEFAULT_MAX_TURNS);
    if row.turns >= i32::try_from(max_turns).unwrap_or(i32::MAX) {
        return Err(refused(
            StatusCode::CONFLICT,
            "max_turns_reached",
            format!("this run has had its {max_turns} turns (`limits.max_turns`)"),
        ));
    }
    write.next_turn();
    let turn = write.turn;
    write.event("turn.started", json!({ "turn": turn })).await?;
    write
        .event(
            "input.received",
            json!({ "type": "message", "queued": false }),
        )
        .await?;
    write.message(&text).await?;
    lifecycle::resume(&mut write.tx, row.id).await?;
    Ok(true)
}

async fn tool_result(write: &mut Write, row: &AgentRunRow, result: ToolResult) -> ApiResult<bool> {
    let waiting = &row.required_actions.0;
    let wanted = waiting
        .iter()
        .any(|action| matches!(action, RequiredAction::ToolResult { call_id, .. } if *call_id == result.call_id));
    if row.status != Status::RequiresAction || !wanted {
        return Err(refused(
            StatusCode::CONFLICT,
            "not_waiting_for_tool_result",
            format!(
                "this run waits for no result of a call `{}`",
                result.call_id
            ),
        ));
    }
    let left: Vec<&RequiredAction> = waiting
        .iter()
        .filter(|action| !matches!(action, RequiredAction::ToolResult { call_id, .. } if *call_id == result.call_id))
        .collect();
    write
        .event(
            "input.received",
            json!({ "type": "tool_result", "call_id": result.call_id,
                                           "is_error": result.is_error }),
        )
        .await?;
    write
        .message(&Message {
            role: Role::User,
            content: vec![Part::ToolResult(result)],
        })
        .await?;
    sqlx::query("UPDATE agent_runs SET required_actions = $2 WHERE id = $1")
        .bind(row.id)
        .bind(sqlx::types::Json(&left))
        .execute(&mut *write.tx)
        .await?;
    if left.is_empty() {
        lifecycle::resume(&mut write.tx, row.id).await?;
    }
    Ok(left.is_empty())
}

/// Whether `principal` may decide on the run's calls: a person or a key of at least the
/// creator's role, and not the run's own key nor a key it made.
async fn may_decide(
    connection: &mut PgConnection,
    principal: &Principal,
    row: &AgentRunRow,
) -> ApiResult<()> {
    let creator: TeamRole = row.creator_role.parse().unwrap_or(TeamRole::Owner);
    principal.require(creator)?;
    let Some(key_id) = principal.api_key_id() else {
        return Ok(());
    };
    let lineage: Vec<Uuid> = sqlx::query_scalar("SELECT lineage FROM api_keys WHERE id = $1")
        .bind(key_id)
        .fetch_optional(connection)
        .await?
        .unwrap_or_default();
    let run_key = row.run_key_id;
    if run_key == Some(key_id) || run_key.is_some_and(|run_key| lineage.contains(&run_key)) {
        return Err(ApiError::Forbidden(
            "a run's own key (or a key it made) cannot decide on the run's calls".to_owned(),
        ));
    }
    Ok(())
}

/// A decision on a call that waits for one: kept with the run's decisions; the run goes on
/// once it waits for nothing more.
async fn approval(write: &mut Write, row: &AgentRunRow, mut decision: Value) -> ApiResult<bool> {
    let call_id = decision["call_id"].as_str().unwrap_or_default().to_owned();
    let waiting = &row.required_actions.0;
    let asked = waiting.iter().find_map(|action| match action {
        RequiredAction::Approval {
            call_id: id,
            tool,
            rule,
            uncertain,
            ..
        } if *id == call_id => Some((tool.clone(), *rule, *uncertain)),
        _ => None,
    });
    let Some((tool, rule, uncertain)) = asked.filter(|_| row.status == Status::RequiresAction)
    else {
        return Err(refused(
            StatusCode::CONFLICT,
            "not_waiting_for_approval",
            format!("this run waits for no decision on a call `{call_id}`"),
        ));
    };
    decision["tool"] = json!(tool);
    decision["rule"] = json!(rule);
    if uncertain {
        decision["uncertain"] = json!(true);
    }
    write.event("approval.resolved", decision.clone()).await?;
    let left: Vec<&RequiredAction> = waiting
        .iter()
        .filter(|action| {
            !matches!(action, RequiredAction::Approval { call_id: id, .. } if *id == call_id)
        })
        .collect();
    sqlx::query(
        "UPDATE agent_runs SET required_actions = $2, decisions = decisions || $3 WHERE id = $1",
    )
    .bind(row.id)
    .bind(sqlx::types::Json(&left))
    .bind(json!([decision]))
    .execute(&mut *write.tx)
    .await?;
    if left.is_empty() {
        lifecycle::resume(&mut write.tx, row.id).await?;
    }
    Ok(left.is_empty())
}

/// The messages queued for the next turn, taken.
pub async fn take_messages(
    connection: &mut PgConnection,
    run_id: Uuid,
) -> Result<Vec<Message>, sqlx::Error> {
    let taken: Vec<(sqlx::types::Json<AgentRunInput>,)> = sqlx::query_as(
        "WITH taken AS (UPDATE agent_run_inputs SET taken = true \
             WHERE run_id = $1 AND NOT taken AND kind = 'message' RETURNING body, created_at) \
         SELECT body FROM taken ORDER BY created_at",
    )
    .bind(run_id)
    .fetch_all(connection)
    .await?;
    Ok(taken
        .into_iter()
        .filter_map(|(input,)| match input.0 {
            AgentRunInput::Message { content } => Some(Message {
                role: Role::User,
                content: vec![Part::Text { text: content }],
            }),
            AgentRunInput::ToolResult { .. }
            | AgentRunInput::Approval { .. }
            | AgentRunInput::Limits { .. } => None,
        })
        .collect())
}

/// Asks the run to cancel (`run` when no scope is given).
pub async fn cancel(
    state: &AppState,
    team_id: Uuid,
    id: Uuid,
    scope: Option<CancelScope>,
    call_id: Option<String>,
) -> ApiResult<AgentRunRow> {
    let mut connection = state.db.acquire().await?;
    rows::fetch(&mut connection, team_id, id).await?;
    drop(connection);
    let scope = match (scope.unwrap_or(CancelScope::Run), call_id) {
        (CancelScope::Run, None) => "run".to_owned(),
        (CancelScope::Turn, None) => "turn".to_owned(),
        (CancelScope::Tool, Some(call_id)) if !call_id.contains('\0') => format!("tool:{call_id}"),
        _ => {
            return Err(ApiError::InvalidRequest(
                "`call_id` goes with `scope: tool`, and only with it".to_owned(),
            ));
        }
    };
    let mut write = Write::unleased(&state.db, id).await?;
    let row = rows::load(&mut write.tx, id).await?;
    if row.status.is_final() {
        return Err(finished(&row));
    }
    if lifecycle::ask_cancel(&mut write.tx, id, &scope).await? {
        write
            .event("cancel.requested", json!({ "scope": scope }))
            .await?;
    }
    write.commit().await?;
    let _ = state.harness.events.send(id);
    state.harness.wake.notify_one();
    let mut connection = state.db.acquire().await?;
    Ok(rows::load(&mut connection, id).await?)
}

/// Deletes a run that ended (with its journal); a run still going is refused.
pub async fn delete(state: &AppState, team_id: Uuid, id: Uuid) -> ApiResult<()> {
    let mut connection = state.db.acquire().await?;
    let row = rows::fetch(&mut connection, team_id, id).await?;
    if !row.status.is_final() {
        return Err(refused(
            StatusCode::CONFLICT,
            "agent_run_active",
            format!("this agent run is {}: cancel it first", row.status),
        ));
    }
    sqlx::query("DELETE FROM agent_runs WHERE id = $1 AND team_id = $2")
        .bind(id)
        .bind(team_id)
        .execute(&mut *connection)
        .await?;
    Ok(())
}
