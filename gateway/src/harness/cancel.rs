//! A tool call watched for a cancel while it runs: every half second the run's row is read,
//! and when a cancel was asked for, the call's command is interrupted (a shell command by
//! its exec id: SIGINT, SIGKILL a second later, the shell session kept; Python by
//! KeyboardInterrupt, the interpreter kept) — the call then ends with what it printed, and
//! the loop carries out the cancel after it. A cancel of this call alone (`tool:CALL_ID`)
//! gives the model the call's output marked cancelled, and the turn goes on.

use std::future::Future;
use std::time::Duration;

use sandbase_harness::{ToolKind, ToolOutcome};
use sandbase_mcp::{ApiRequest, Backend};
use serde_json::json;

use super::run::Run;

pub async fn watched<B: Backend>(
    run: &Run<'_, B>,
    call_id: &str,
    exec_id: &str,
    kind: ToolKind,
    call: impl Future<Output = ToolOutcome>,
) -> ToolOutcome {
    tokio::pin!(call);
    let mut interrupted = false;
    loop {
        tokio::select! {
            outcome = &mut call => return marked(outcome, interrupted),
            () = tokio::time::sleep(Duration::from_millis(500)), if !interrupted => {
                if asked(run, call_id).await {
                    interrupted = true;
                    interrupt(run, exec_id, kind).await;
                }
            }
        }
    }
}

/// A call's outcome, marked an error the model is told of when it was cancelled.
fn marked(mut outcome: ToolOutcome, interrupted: bool) -> ToolOutcome {
    if interrupted {
        outcome.is_error = true;
        outcome
            .content
            .push_str("\n[this call was cancelled by the client]");
        outcome.detail["cancelled"] = json!(true);
    }
    outcome
}

/// Whether a cancel reaching this call was asked for: of the turn, the run, or this call.
async fn asked<B>(run: &Run<'_, B>, call_id: &str) -> bool {
    let scope = sqlx::query_scalar::<_, Option<String>>(
        "SELECT cancel_scope FROM agent_runs WHERE id = $1",
    )
    .bind(run.row.id)
    .fetch_one(&run.state.db)
    .await
    .ok()
    .flatten();
    match scope
        .as_deref()
        .and_then(|scope| scope.strip_prefix("tool:"))
    {
        Some(named) => named == call_id,
        None => scope.is_some(),
    }
}

async fn interrupt<B: Backend>(run: &Run<'_, B>, exec_id: &str, kind: ToolKind) {
    let sandbox = run.sandbox();
    let path = match kind {
        ToolKind::Shell => format!("/v1/sandboxes/{sandbox}/execs/{exec_id}/cancel"),
        ToolKind::Python => format!("/v1/sandboxes/{sandbox}/code/contexts/default/interrupt"),
        _ => return,
    };
    if let Err(why) = run
        .backend
        .call(Some(&run.parts), ApiRequest::post(path, json!({})))
        .await
    {
        tracing::warn!(error = %why, "interrupting a cancelled tool call failed");
    }
}
