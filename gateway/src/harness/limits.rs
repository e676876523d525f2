//! A run's limits: what happens when one is reached (`limited`, or with `on_limit: ask` a
//! `limit` action the run waits on), and new limits posted to a run (`POST …/inputs`
//! `limits`) — `max_credits` becomes the cap of the run's key and of the sandbox it made.

use http::StatusCode;
use sandbase_api::agent_runs::{AgentLimits, OnLimit, RequiredAction};
use sandbase_mcp::Backend;
use serde_json::json;

use super::journal::{self, Write};
use super::lifecycle::{self, Status};
use super::rows::AgentRunRow;
use super::run::{Flow, Halt, Run};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The run reached `limit` (`code` and `message` say how): `limited`, or waiting for new
/// limits when its `on_limit` is `ask`.
pub async fn reached<B: Backend>(
    run: &Run<'_, B>,
    limit: &str,
    code: &str,
    message: String,
) -> Result<Flow, Halt> {
    let ask = run.row.limits.0.on_limit == Some(OnLimit::Ask);
    let mut write = journal::begin(&run.state.db, &run.lease).await?;
    write
        .event(
            "limit.reached",
            json!({ "limit": limit, "code": code, "message": message, "ask": ask }),
        )
        .await?;
    run.commit(write).await?;
    if ask {
        let required = json!([{ "type": "limit", "limit": limit, "message": message }]);
        return run.settle(Status::RequiresAction, None, required).await;
    }
    run.settle(Status::Limited, Some((code, message)), json!([]))
        .await
}

/// New limits for the run: those given replace its own. True when the run waited on a
/// limit and now goes on.
pub async fn raise(write: &mut Write, row: &AgentRunRow, given: AgentLimits) -> ApiResult<bool> {
    let cap =
        crate::sandboxes::validate::parse_cap("limits.max_credits", given.max_credits.as_deref())?;
    let mut limits = row.limits.0.clone();
    let changed = json!(given);
    limits.max_turns = given.max_turns.or(limits.max_turns);
    limits.max_tool_calls = given.max_tool_calls.or(limits.max_tool_calls);
    limits.max_wall_secs = given.max_wall_secs.or(limits.max_wall_secs);
    limits.on_limit = given.on_limit.or(limits.on_limit);
    if let Some(cap) = cap {
        limits.max_credits = given.max_credits.clone();
        set_caps(write, row, cap).await?;
    }
    let left: Vec<&RequiredAction> = (row.required_actions.0.iter())
        .filter(|action| !matches!(action, RequiredAction::Limit { .. }))
        .collect();
    sqlx::query("UPDATE agent_runs SET limits = $2, required_actions = $3 WHERE id = $1")
        .bind(row.id)
        .bind(sqlx::types::Json(&limits))
        .bind(sqlx::types::Json(&left))
        .execute(&mut *write.tx)
        .await?;
    write
        .event(
            "input.received",
            json!({ "type": "limits", "limits": changed }),
        )
        .await?;
    let waited = row.status == Status::RequiresAction
        && left.len() < row.required_actions.0.len()
        && left.is_empty();
    if waited {
        lifecycle::resume(&mut write.tx, row.id).await?;
    }
    Ok(waited)
}

/// `cap` (micro-credits) as the cap of the run's key and of the sandbox it made.
async fn set_caps(write: &mut Write, row: &AgentRunRow, cap: i64) -> ApiResult<()> {
    let Some(key) = row.run_key_id else {
        return Err(ApiError::Refused {
            status: StatusCode::CONFLICT,
            code: "agent_run_finished",
            message: "this run has no key any more".to_owned(),
        });
    };
    sqlx::query("UPDATE api_keys SET max_credits = $2 WHERE id = $1")
        .bind(key)
        .bind(cap)
        .execute(&mut *write.tx)
        .await?;
    if let Some(sandbox) = row.sandbox_id.filter(|_| row.owns_sandbox) {
        sqlx::query("UPDATE sandboxes SET max_credits = $2 WHERE id = $1")
            .bind(sandbox)
            .bind(cap)
            .execute(&mut *write.tx)
            .await?;
    }
    Ok(())
}

/// Drops the cached headroom of the run's key and sandbox after new limits were committed:
/// the next reservation reads the new caps.
pub async fn forget_caps(state: &AppState, row: &AgentRunRow) {
    let caps = (row.run_key_id.map(crate::credits::Cap::Key).into_iter())
        .chain(row.sandbox_id.map(crate::credits::Cap::Sandbox));
    for cap in caps {
        let _ = state.billing.admission.forget_cap(cap).await;
    }
}
