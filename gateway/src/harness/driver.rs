//! The loop of one run on the gateway holding its lease: the run's key opened, its model
//! looked up, its sandbox made when it has none yet, what a former owner left begun
//! recovered, then step after step — a model call when the conversation ends with the
//! user's words or tool results, the tool calls the model's last message asked for, or
//! the turn's end (the next queued message starts another, else the run is idle) — until
//! it waits, ends, or the lease is lost.

use std::sync::Arc;

use sandbase_api::conversation::{Message, Part, Role, ToolCall};
use sandbase_harness::{Family, prompt};
use sandbase_mcp::{ApiRequest, Backend};
use serde_json::{Value, json};

use super::journal;
use super::lease::{self, Lease};
use super::lifecycle::{self, Status};
use super::rows::{self, AgentRunRow};
use super::run::{DEFAULT_MAX_TURNS, Flow, Halt, Run};
use crate::state::AppState;

/// Steps the run `lease` holds until it waits, ends, or the lease is lost.
pub async fn drive<B: Backend>(state: &AppState, backend: &B, lease: Arc<Lease>) {
    let _heartbeat = lease::heartbeat(state.clone(), lease.clone());
    match prepare(state, backend, lease).await {
        Ok(Some(run)) => match turns(&run).await {
            Ok(()) => {}
            Err(Halt::LeaseLost) => tracing::info!("another gateway holds this run now"),
            Err(Halt::Database(error)) => {
                tracing::warn!(error = %error, "stepping an agent run failed")
            }
        },
        Ok(None) => {}
        Err(Halt::LeaseLost) => tracing::info!("another gateway holds this run now"),
        Err(Halt::Database(error)) => {
            tracing::warn!(error = %error, "starting an agent run failed")
        }
    }
}

/// The run ready to step (`None`: it settled already, its key or model missing).
async fn prepare<'a, B: Backend>(
    state: &'a AppState,
    backend: &'a B,
    lease: Arc<Lease>,
) -> Result<Option<Run<'a, B>>, Halt> {
    let mut connection = state.db.acquire().await?;
    let row = rows::load(&mut connection, lease.claim.run_id).await?;
    drop(connection);
    let head = super::run_key::head(state, &row).await;
    let opened = head.is_some();
    let parts = head.unwrap_or_else(|| http::Request::new(()).into_parts().0);
    let egress = row.sandbox_spec.as_ref().and_then(|spec| {
        spec.pointer("/egress/allow")
            .and_then(Value::as_array)
            .map(|hosts| {
                hosts
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .or_else(|| Some(Vec::new()))
    });
    let mut run = Run {
        state,
        backend,
        lease,
        system: prompt::system(row.instructions.as_deref(), &row.tools.0, egress.as_deref()),
        tools: sandbase_harness::tools::definitions(&row.tools.0),
        row,
        parts,
        family: Family::OpenAi,
        max_output: 4096,
        prices: sandbase_harness::Prices::default(),
        context_window: 128_000,
        elided: Default::default(),
        conversation: Default::default(),
        mcp: Vec::new(),
    };
    if !opened {
        let why = "the run's key could not be opened (the vault's keys changed?)".to_owned();
        run.settle(Status::Failed, Some(("key_unavailable", why)), json!([]))
            .await?;
        return Ok(None);
    }
    if run
        .row
        .cancel_scope
        .as_deref()
        .is_some_and(|scope| !scope.starts_with("tool:"))
    {
        // Cancelled before it was stepped: the loop ends it first thing.
        return Ok(Some(run));
    }
    if !find_model(&mut run).await? || !ensure_sandbox(&mut run).await? {
        return Ok(None);
    }
    super::mcp::offer(&mut run).await?;
    if !super::recover::unfinished(&run).await? {
        return Ok(None);
    }
    Ok(Some(run))
}

/// The run's model's family and output limit, from the store's list; settles the run
/// `failed` when the store has it no more.
async fn find_model<B: Backend>(run: &mut Run<'_, B>) -> Result<bool, Halt> {
    let listed = run
        .backend
        .call(Some(&run.parts), ApiRequest::get("/v1/store/models"))
        .await
        .ok()
        .and_then(|answer| answer.json());
    let model = listed.as_ref().and_then(|list| {
        list["models"]
            .as_array()?
            .iter()
            .find(|model| model["id"] == run.row.model.as_str())
            .cloned()
    });
    match model {
        Some(model) => {
            run.family = Family::parse(model["family"].as_str().unwrap_or_default());
            run.max_output = model["max_output"].as_u64().unwrap_or(4096);
            run.context_window = model["context_window"].as_u64().unwrap_or(128_000);
            run.prices = sandbase_harness::Prices::from_listing(&model);
            Ok(true)
        }
        None => {
            let why = format!("the store offers no model `{}` to this run", run.row.model);
            run.settle(Status::Failed, Some(("model_not_found", why)), json!([]))
                .await?;
            Ok(false)
        }
    }
}

/// Makes the run's sandbox when it has none yet (recorded at once, under the epoch).
async fn ensure_sandbox<B: Backend>(run: &mut Run<'_, B>) -> Result<bool, Halt> {
    if run.row.sandbox_id.is_some() {
        if run.row.owns_sandbox {
            // Paused while the run waited: resumed (a sandbox that runs answers 409, kept).
            let path = format!("/v1/sandboxes/{}/resume", run.sandbox());
            let _ = run
                .backend
                .call(Some(&run.parts), ApiRequest::post(path, json!({})))
                .await;
        }
        return Ok(true);
    }
    run.check_lease()?;
    let mut spec = run.row.sandbox_spec.clone().unwrap_or_else(|| json!({}));
    if let Some(cap) = &run.row.limits.0.max_credits
        && spec.get("max_credits").is_none_or(Value::is_null)
    {
        // The sandbox stops at the run's budget too (the run's key caps it as well).
        spec["max_credits"] = json!(cap);
    }
    if let Some(snapshot) = run.row.checkpoint_snapshot {
        // Released while the run waited: the next sandbox starts from its last snapshot.
        spec["snapshot"] = json!(snapshot);
    }
    if spec.get("timeout_secs").is_none_or(Value::is_null) {
        // The sandbox lives as long as the run may (the run destroys it when it ends).
        spec["timeout_secs"] = json!(run.state.settings.sandboxes.max_timeout_secs);
    }
    let made = run
        .backend
        .call(Some(&run.parts), ApiRequest::post("/v1/sandboxes", spec))
        .await;
    let body = made
        .as_ref()
        .ok()
        .and_then(|answer| answer.json())
        .unwrap_or(Value::Null);
    let id = body["id"]
        .as_str()
        .and_then(|id| id.parse::<uuid::Uuid>().ok());
    let Some(id) = id.filter(|_| made.as_ref().is_ok_and(|answer| answer.is_success())) else {
        let code = body["error"]["code"]
            .as_str()
            .unwrap_or("sandbox_failed")
            .to_owned();
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("the sandbox could not be made");
        if matches!(code.as_str(), "spend_cap_reached" | "insufficient_credits") {
            super::steps::spent(run, &code, message.to_owned()).await?;
        } else {
            run.settle(
                Status::Failed,
                Some((code.as_str(), message.to_owned())),
                json!([]),
            )
            .await?;
        }
        return Ok(false);
    };
    let mut write = journal::begin(&run.state.db, &run.lease).await?;
    sqlx::query("UPDATE agent_runs SET sandbox_id = $2 WHERE id = $1")
        .bind(run.row.id)
        .bind(id)
        .execute(&mut *write.tx)
        .await?;
    write
        .event("sandbox.ready", json!({ "sandbox_id": id }))
        .await?;
    run.commit(write).await?;
    run.row.sandbox_id = Some(id);
    Ok(true)
}

/// What comes next in a conversation.
enum Next {
    Model,
    /// The calls of the model's last message that have no result yet.
    Tools(Vec<ToolCall>),
    EndOfTurn,
}

fn next(conversation: &[Message]) -> Next {
    let Some(asked) = conversation
        .iter()
        .rposition(|message| message.role == Role::Assistant)
    else {
        return Next::Model;
    };
    let answered: Vec<&str> = conversation[asked + 1..]
        .iter()
        .flat_map(|message| &message.content)
        .filter_map(|part| match part {
            Part::ToolResult(result) => Some(result.call_id.as_str()),
            _ => None,
        })
        .collect();
    let pending: Vec<ToolCall> = conversation[asked]
        .content
        .iter()
        .filter_map(|part| match part {
            Part::ToolCall(call) if !answered.contains(&call.id.as_str()) => Some(call.clone()),
            _ => None,
        })
        .collect();
    if !pending.is_empty() {
        Next::Tools(pending)
    } else if asked + 1 == conversation.len() {
        Next::EndOfTurn
    } else {
        Next::Model
    }
}

/// Step after step until the run waits or ends.
async fn turns<B: Backend>(run: &Run<'_, B>) -> Result<(), Halt> {
    loop {
        run.check_lease()?;
        let mut connection = run.state.db.acquire().await?;
        let (now, conversation) = run.load(&mut connection).await?;
        drop(connection);
        if let Some(scope) = now.cancel_scope.as_deref() {
            if scope.starts_with("tool:") {
                // The call was cancelled (or had ended): the turn goes on.
                let mut write = journal::begin(&run.state.db, &run.lease).await?;
                lifecycle::tool_cancel_done(&mut write.tx, run.row.id, scope).await?;
                run.commit(write).await?;
                continue;
            }
            cancelled(run, scope).await?;
            return Ok(());
        }
        if let Some(flow) = super::steps::over_limit(run, &now).await? {
            let Flow::Stop = flow else { continue };
            return Ok(());
        }
        let flow = match next(&conversation) {
            Next::Model => super::steps::model(run, &conversation).await?,
            Next::Tools(calls) => super::steps::tools(run, &now, calls).await?,
            Next::EndOfTurn => end_of_turn(run, &now).await?,
        };
        if let Flow::Stop = flow {
            return Ok(());
        }
    }
}

/// A cancel asked for: `turn` leaves the run idle, `run` ends it `cancelled`, `idle` (its
/// idle timeout) `completed`, `revoked` (its key was) `failed`.
async fn cancelled<B: Backend>(run: &Run<'_, B>, scope: &str) -> Result<Flow, Halt> {
    match scope {
        "turn" => run.settle(Status::Idle, None, json!([])).await,
        "idle" => run.settle(Status::Completed, None, json!([])).await,
        "revoked" => {
            let why = "the run's key was revoked (its creator's key was, or an admin did)";
            run.settle(
                Status::Failed,
                Some(("key_revoked", why.to_owned())),
                json!([]),
            )
            .await
        }
        _ => run.settle(Status::Cancelled, None, json!([])).await,
    }
}

/// The turn ended: the next queued message starts another (within `max_turns`), else the
/// run is idle.
async fn end_of_turn<B: Backend>(run: &Run<'_, B>, now: &AgentRunRow) -> Result<Flow, Halt> {
    let mut write = journal::begin(&run.state.db, &run.lease).await?;
    let queued = super::inputs::take_messages(&mut write.tx, run.row.id).await?;
    if queued.is_empty() {
        drop(write);
        return run.settle(Status::Idle, None, json!([])).await;
    }
    let max_turns = now.limits.0.max_turns.unwrap_or(DEFAULT_MAX_TURNS);
    if now.turns >= i32::try_from(max_turns).unwrap_or(i32::MAX) {
        drop(write);
        return super::steps::limited(run, "max_turns").await;
    }
    let turn = write.turn;
    write
        .event("turn.completed", json!({ "turn": turn }))
        .await?;
    write.next_turn();
    let turn = write.turn;
    write.event("turn.started", json!({ "turn": turn })).await?;
    for message in queued {
        write.message(&message).await?;
    }
    run.commit(write).await?;
    Ok(Flow::Continue)
}
