//! A tool call watched for a cancel while it runs: every half second the run's row is read,
//! and when a cancel was asked for, the call's command is interrupted (a shell command by
//! its exec id: SIGINT, SIGKILL a second later, the shell session kept; Python by
//! KeyboardInterrupt, the interpreter kept) — the call then ends with what it printed, and
//! the loop carries out the cancel after it.

use std::future::Future;
use std::time::Duration;

use sandbase_harness::{ToolKind, ToolOutcome};
use sandbase_mcp::{ApiRequest, Backend};
use serde_json::json;

use super::run::Run;

pub async fn watched<B: Backend>(
    run: &Run<'_, B>,
    exec_id: &str,
    kind: ToolKind,
    call: impl Future<Output = ToolOutcome>,
) -> ToolOutcome {
    tokio::pin!(call);
    let mut interrupted = false;
    loop {
        tokio::select! {
            outcome = &mut call => return outcome,
            () = tokio::time::sleep(Duration::from_millis(500)), if !interrupted => {
                if asked(run).await {
                    interrupted = true;
                    interrupt(run, exec_id, kind).await;
                }
            }
        }
    }
}

async fn asked<B>(run: &Run<'_, B>) -> bool {
    sqlx::query_scalar::<_, Option<String>>("SELECT cancel_scope FROM agent_runs WHERE id = $1")
        .bind(run.row.id)
        .fetch_one(&run.state.db)
        .await
        .ok()
        .flatten()
        .is_some()
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
