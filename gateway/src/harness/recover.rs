//! What a gateway that adopted a run does with the steps its former owner left begun
//! (`intended`): completed work is never run again. A model call is made again by the loop
//! (the lost call is settled by the store: its reported usage, else its reservation). A
//! shell command is looked up on its worker by its exec id — finished or still running, its
//! result is adopted (a second start of the same id answers the first and runs nothing);
//! unknown there, and any other tool, the call is `interrupted` and the model told that
//! it may or may not have run (`on_uncertain_tool: fail`).

use sandbase_api::conversation::ToolCall;
use sandbase_harness::tools::{self, ToolKind, ToolOutcome};
use sandbase_mcp::{ApiRequest, Backend};
use serde_json::json;

use super::journal;
use super::rows::{self, StepRow};
use super::run::{Halt, Run};
use super::steps::{exec_id, record_tool};

/// Settles every step left begun; false when the run cannot go on.
pub async fn unfinished<B: Backend>(run: &Run<'_, B>) -> Result<bool, Halt> {
    let mut connection = run.state.db.acquire().await?;
    let left = rows::unfinished_steps(&mut connection, run.row.id).await?;
    drop(connection);
    for step in left {
        run.check_lease()?;
        if step.kind == "model" {
            let mut write = journal::begin(&run.state.db, run.lease.claim).await?;
            let reason =
                json!({ "reason": "the gateway making this call stopped; it is made again" });
            write
                .finish_step(step.seq, "interrupted", &reason, 0)
                .await?;
            run.commit(write).await?;
            continue;
        }
        let call = ToolCall {
            id: step.call_id.clone().unwrap_or_default(),
            name: step.name.clone(),
            arguments: step.args.clone(),
        };
        let outcome = adopt(run, &step, &call).await;
        record_tool(run, step.seq, &call, &outcome, 0).await?;
    }
    Ok(true)
}

/// The begun call's result where its worker kept it, else an interrupted call.
async fn adopt<B: Backend>(run: &Run<'_, B>, step: &StepRow, call: &ToolCall) -> ToolOutcome {
    let kept = if run.kind(call) == ToolKind::Shell {
        kept_command(run, &exec_id(run, step.seq), call).await
    } else {
        None
    };
    kept.unwrap_or_else(|| {
        ToolOutcome::interrupted(format!(
            "this `{}` call was under way when the gateway running it stopped, and its end is \
             unknown: it may have run wholly, in part, or not at all. Check the sandbox before \
             you repeat it.",
            call.name
        ))
    })
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
