//! What a gateway that adopted a run does with the steps its former owner left begun
//! (`intended`): completed work is never run again. A model call is made again by the loop
//! (the lost call is settled by the store: its reported usage, else its reservation). A
//! shell command is looked up on its worker by its exec id — finished or still running, its
//! result is adopted (a second start of the same id answers the first and runs nothing);
//! unknown there, and any other tool, the call is `interrupted` and the model told that
//! it may or may not have run (`on_uncertain_tool: fail`), or the run waits for a person to
//! decide whether it runs again (`ask`).

use sandbase_api::conversation::ToolCall;
use sandbase_harness::tools::{self, ToolKind, ToolOutcome};
use sandbase_mcp::{ApiRequest, Backend};
use serde_json::{Value, json};

use super::journal;
use super::lifecycle::Status;
use super::rows::{self, StepRow};
use super::run::{Halt, Run};
use super::steps::{exec_id, record_tool};

/// Settles every step left begun; false when the run cannot go on (it waits for a person
/// to decide about calls whose end is unknown, `on_uncertain_tool: ask`).
pub async fn unfinished<B: Backend>(run: &Run<'_, B>) -> Result<bool, Halt> {
    let mut connection = run.state.db.acquire().await?;
    let left = rows::unfinished_steps(&mut connection, run.row.id).await?;
    drop(connection);
    let mut uncertain = Vec::new();
    for step in left {
        run.check_lease()?;
        if step.kind == "model" {
            let reason =
                json!({ "reason": "the gateway making this call stopped; it is made again" });
            interrupted(run, step.seq, &reason).await?;
            continue;
        }
        let call = ToolCall {
            id: step.call_id.clone().unwrap_or_default(),
            name: step.name.clone(),
            arguments: step.args.clone(),
        };
        match adopt(run, &step, &call).await {
            Some(outcome) => record_tool(run, step.seq, &call, &outcome, 0).await?,
            None if run.row.on_uncertain_tool == "ask" => {
                let reason = json!({ "reason": "its end is unknown", "uncertain": true });
                interrupted(run, step.seq, &reason).await?;
                uncertain.push(call);
            }
            None => {
                let outcome = ToolOutcome::interrupted(format!(
                    "this `{}` call was under way when the gateway running it stopped, and its \
                     end is unknown: it may have run wholly, in part, or not at all. Check the \
                     sandbox before you repeat it.",
                    call.name
                ));
                record_tool(run, step.seq, &call, &outcome, 0).await?;
            }
        }
    }
    if uncertain.is_empty() {
        return Ok(true);
    }
    ask(run, &uncertain).await?;
    Ok(false)
}

/// A step ended `interrupted`, with nothing told the model yet.
async fn interrupted<B: Backend>(run: &Run<'_, B>, step: i32, reason: &Value) -> Result<(), Halt> {
    let mut write = journal::begin(&run.state.db, &run.lease).await?;
    write.finish_step(step, "interrupted", reason, 0).await?;
    run.commit(write).await
}

/// The run waits for a person to decide whether each call whose end is unknown runs again.
async fn ask<B: Backend>(run: &Run<'_, B>, calls: &[ToolCall]) -> Result<(), Halt> {
    let mut write = journal::begin(&run.state.db, &run.lease).await?;
    let mut required = Vec::new();
    for call in calls {
        write
            .event(
                "approval.requested",
                json!({ "call_id": call.id, "tool": call.name, "args": call.arguments,
                        "uncertain": true }),
            )
            .await?;
        let tool = sandbase_harness::approval::tool_label(run.kind(call), call);
        required.push(
            json!({ "type": "approval", "call_id": call.id, "name": call.name,
                              "arguments": call.arguments, "tool": tool, "rule": 0,
                              "uncertain": true }),
        );
    }
    run.commit(write).await?;
    run.settle(Status::RequiresAction, None, Value::Array(required))
        .await
        .map(|_| ())
}

/// The begun call's result where its worker kept it (a shell command, by its exec id).
async fn adopt<B: Backend>(
    run: &Run<'_, B>,
    step: &StepRow,
    call: &ToolCall,
) -> Option<ToolOutcome> {
    if run.kind(call) == ToolKind::Shell {
        kept_command(run, &exec_id(run, step.seq), call).await
    } else {
        None
    }
}

/// A shell call's command as its worker keeps it under its exec id: started again, which
/// answers the first start's result (whole once it ends) and runs nothing.
async fn kept_command<B: Backend>(
    run: &Run<'_, B>,
    exec_id: &str,
    call: &ToolCall,
) -> Option<ToolOutcome> {
    let sandbox = run.sandbox();
    let path = format!("/v1/sandboxes/{sandbox}/execs/{exec_id}");
    let kept = run
        .backend
        .call(Some(&run.parts), ApiRequest::get(path))
        .await
        .ok()?;
    if !kept.is_success() {
        return None;
    }
    let request = tools::shell_request(&sandbox, exec_id, &call.arguments)?;
    let answer = run.backend.call(Some(&run.parts), request).await.ok()?;
    let result = answer.json().filter(|_| answer.is_success())?;
    let mut outcome = tools::command_outcome(&sandbox, exec_id, &result);
    outcome.detail["adopted"] = json!(true);
    Some(outcome)
}
