//! An agent run as PostgreSQL keeps it, and the reads of it and its journal.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sandbase_api::agent_runs::{
    AgentLimits, AgentRun, AgentRunEvent, AgentRunStep, AgentTool, ApprovalRule, RequiredAction,
};
use sandbase_api::conversation::{Message, Usage};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::lifecycle::Status;
use crate::error::{ApiError, ApiResult};

pub const RUN_COLUMNS: &str = "id, team_id, creator_role, run_key_id, key_nonce, key_sealed, \
    model, instructions, tools, sandbox_spec, sandbox_id, owns_sandbox, limits, approvals, \
    decisions, parallel_tool_calls, on_uncertain_tool, checkpoints, checkpoint_snapshot, \
    metadata, status, error, required_actions, turns, tool_calls, usage, cost_micro, last_seq, \
    cancel_scope, request_hash, created_at, started_at, finished_at";

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AgentRunRow {
    pub id: Uuid,
    pub team_id: Uuid,
    pub creator_role: String,
    pub run_key_id: Option<Uuid>,
    pub key_nonce: Vec<u8>,
    pub key_sealed: Vec<u8>,
    pub model: String,
    pub instructions: Option<String>,
    pub tools: sqlx::types::Json<Vec<AgentTool>>,
    pub sandbox_spec: Option<Value>,
    pub sandbox_id: Option<Uuid>,
    pub owns_sandbox: bool,
    pub limits: sqlx::types::Json<AgentLimits>,
    pub approvals: sqlx::types::Json<Vec<ApprovalRule>>,
    /// The decisions made on calls: `{call_id, tool, rule, decision, remember, reason, by}`.
    pub decisions: Value,
    pub parallel_tool_calls: bool,
    /// `fail` or `ask`: what becomes of a call whose end no worker knows after adoption.
    pub on_uncertain_tool: String,
    /// `none` or `every_turn`.
    pub checkpoints: String,
    pub checkpoint_snapshot: Option<Uuid>,
    pub metadata: sqlx::types::Json<BTreeMap<String, String>>,
    pub status: Status,
    pub error: Option<Value>,
    pub required_actions: sqlx::types::Json<Vec<RequiredAction>>,
    pub turns: i32,
    pub tool_calls: i32,
    pub usage: sqlx::types::Json<Usage>,
    pub cost_micro: i64,
    pub last_seq: i64,
    pub cancel_scope: Option<String>,
    pub request_hash: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl AgentRunRow {
    pub fn to_api(&self) -> AgentRun {
        AgentRun {
            id: self.id,
            status: self.status.to_api(),
            model: self.model.clone(),
            instructions: self.instructions.clone(),
            tools: self.tools.0.clone(),
            sandbox_id: self.sandbox_id,
            owns_sandbox: self.owns_sandbox,
            checkpoint: self.checkpoint_snapshot,
            limits: self.limits.0.clone(),
            approvals: self.approvals.0.clone(),
            required_actions: self.required_actions.0.clone(),
            turns: u32::try_from(self.turns).unwrap_or(0),
            tool_calls: u32::try_from(self.tool_calls).unwrap_or(0),
            usage: self.usage.0,
            cost_micro: self.cost_micro,
            last_seq: self.last_seq,
            key_id: self.run_key_id,
            error: self
                .error
                .as_ref()
                .and_then(|error| serde_json::from_value(error.clone()).ok()),
            metadata: self.metadata.0.clone(),
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
        }
    }
}

/// The run `id` of `team_id` (404 for any other team's).
pub async fn fetch(
    connection: &mut PgConnection,
    team_id: Uuid,
    id: Uuid,
) -> ApiResult<AgentRunRow> {
    sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM agent_runs WHERE id = $1 AND team_id = $2"
    ))
    .bind(id)
    .bind(team_id)
    .fetch_optional(connection)
    .await?
    .ok_or(ApiError::NotFound("agent run"))
}

/// The run `id`, whoever's it is (for the gateway stepping it).
pub async fn load(connection: &mut PgConnection, id: Uuid) -> Result<AgentRunRow, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM agent_runs WHERE id = $1"
    ))
    .bind(id)
    .fetch_one(connection)
    .await
}

/// A run's row with the messages after its conversation's `after`th.
#[derive(sqlx::FromRow)]
struct RowAndNew {
    #[sqlx(flatten)]
    row: AgentRunRow,
    new_items: sqlx::types::Json<Vec<(i32, Message)>>,
}

/// The run's row and, in the same round trip, the messages after the `after`th of its
/// conversation with their numbers (messages are only ever appended, under the run's row
/// lock, so a run's conversation can be read on from where it was).
pub async fn load_after(
    connection: &mut PgConnection,
    id: Uuid,
    after: i32,
) -> Result<(AgentRunRow, Vec<(i32, Message)>), sqlx::Error> {
    let loaded: RowAndNew = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS},            (SELECT coalesce(jsonb_agg(jsonb_build_array(i.seq, i.message) ORDER BY i.seq), '[]')             FROM agent_run_items i WHERE i.run_id = $1 AND i.seq > $2) AS new_items          FROM agent_runs WHERE id = $1"
    ))
    .bind(id)
    .bind(after)
    .fetch_one(connection)
    .await?;
    Ok((loaded.row, loaded.new_items.0))
}

/// The team's runs, newest first (the last 100).
pub async fn list(connection: &mut PgConnection, team_id: Uuid) -> ApiResult<Vec<AgentRun>> {
    let rows: Vec<AgentRunRow> = sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM agent_runs WHERE team_id = $1 \
         ORDER BY created_at DESC, id DESC LIMIT 100"
    ))
    .bind(team_id)
    .fetch_all(connection)
    .await?;
    Ok(rows.iter().map(AgentRunRow::to_api).collect())
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StepRow {
    pub seq: i32,
    pub turn: i32,
    pub kind: String,
    pub state: String,
    pub call_id: Option<String>,
    pub name: String,
    pub args: Value,
    pub result: Option<Value>,
    pub cost_micro: i64,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

const STEP_COLUMNS: &str = "seq, turn, kind, step_state AS state, call_id, name, args, result, \
    cost_micro, started_at, finished_at";

impl StepRow {
    pub fn to_api(&self) -> AgentRunStep {
        AgentRunStep {
            seq: u32::try_from(self.seq).unwrap_or(0),
            turn: u32::try_from(self.turn).unwrap_or(0),
            kind: self.kind.clone(),
            state: self.state.clone(),
            name: self.name.clone(),
            call_id: self.call_id.clone(),
            args: self.args.clone(),
            result: self.result.clone(),
            cost_micro: self.cost_micro,
            started_at: self.started_at,
            finished_at: self.finished_at,
        }
    }
}

/// The run's steps in order.
pub async fn steps(
    connection: &mut PgConnection,
    run_id: Uuid,
) -> Result<Vec<StepRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {STEP_COLUMNS} FROM agent_run_steps WHERE run_id = $1 ORDER BY seq"
    ))
    .bind(run_id)
    .fetch_all(connection)
    .await
}

/// The run's steps begun and never ended (what a former owner left).
pub async fn unfinished_steps(
    connection: &mut PgConnection,
    run_id: Uuid,
) -> Result<Vec<StepRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {STEP_COLUMNS} FROM agent_run_steps WHERE run_id = $1 AND step_state = $2 \
         ORDER BY seq"
    ))
    .bind(run_id)
    .bind("intended")
    .fetch_all(connection)
    .await
}

#[derive(Debug, Clone, sqlx::FromRow)]
struct EventRow {
    seq: i64,
    turn: i32,
    #[sqlx(rename = "type")]
    kind: String,
    data: Value,
    at: DateTime<Utc>,
}

/// Up to `limit` events after `after`.
pub async fn events(
    connection: &mut PgConnection,
    run_id: Uuid,
    after: i64,
    limit: i64,
) -> Result<Vec<AgentRunEvent>, sqlx::Error> {
    let rows: Vec<EventRow> = sqlx::query_as(
        "SELECT seq, turn, type, data, at FROM agent_run_events \
         WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(run_id)
    .bind(after)
    .bind(limit)
    .fetch_all(connection)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| AgentRunEvent {
            seq: row.seq,
            run_id,
            turn: u32::try_from(row.turn).unwrap_or(0),
            at: row.at,
            kind: row.kind,
            data: row.data,
        })
        .collect())
}

type TurnRow = (
    i32,
    Option<serde_json::Value>,
    i64,
    i64,
    i64,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

/// The run's turns, from its events, steps and conversation.
pub async fn turns(
    connection: &mut PgConnection,
    run_id: Uuid,
) -> Result<Vec<sandbase_api::agent_runs::AgentRunTurn>, sqlx::Error> {
    let rows: Vec<TurnRow> = sqlx::query_as(
        "SELECT e.turn, \
           (SELECT i.message FROM agent_run_items i WHERE i.run_id = $1 AND i.turn = e.turn \
             ORDER BY i.seq LIMIT 1), \
           (SELECT count(*) FROM agent_run_steps s \
             WHERE s.run_id = $1 AND s.turn = e.turn AND s.kind = 'model'), \
           (SELECT count(*) FROM agent_run_steps s \
             WHERE s.run_id = $1 AND s.turn = e.turn AND s.kind = 'tool'), \
           (SELECT coalesce(sum(s.cost_micro), 0)::bigint FROM agent_run_steps s \
             WHERE s.run_id = $1 AND s.turn = e.turn), \
           min(e.at) FILTER (WHERE e.type = 'turn.started'), \
           max(e.at) FILTER (WHERE e.type = 'turn.completed') \
         FROM agent_run_events e WHERE e.run_id = $1 AND e.turn > 0 \
         GROUP BY e.turn ORDER BY e.turn",
    )
    .bind(run_id)
    .fetch_all(connection)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(turn, input, models, tools, cost, started, completed)| {
            sandbase_api::agent_runs::AgentRunTurn {
                turn: turn.max(0) as u32,
                input,
                model_steps: models.max(0) as u32,
                tool_steps: tools.max(0) as u32,
                cost_micro: cost,
                started_at: started,
                completed_at: completed,
            }
        })
        .collect())
}
