//! Sandboxes of waiting runs: a run that waits (`idle`, `requires_action`) longer than its
//! `max_wait_secs` has the sandbox it made released — snapshotted first when the run keeps
//! checkpoints (resumed for it: a paused sandbox cannot be snapshotted), then destroyed —
//! under the run's row lock, so no input steps the run meanwhile; its next turn starts a new
//! sandbox from the last snapshot. And the snapshot taken at each turn's end
//! (`checkpoints: every_turn`).

use sandbase_mcp::{ApiRequest, Backend};
use serde_json::json;
use uuid::Uuid;

use super::journal::Write;
use super::lifecycle::Status;
use super::rows;
use crate::state::AppState;

/// Releases the sandboxes of runs that waited past their `max_wait_secs`.
pub async fn release_expired<B: Backend>(state: &AppState, backend: &B) -> Result<(), sqlx::Error> {
    let due: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT id FROM agent_runs \
         WHERE status IN ('idle', 'requires_action') AND owns_sandbox \
           AND sandbox_id IS NOT NULL \
           AND updated_at + make_interval(secs => max_wait_secs) < now() \
         LIMIT 20",
    )
    .fetch_all(&state.db)
    .await?;
    for (id,) in due {
        release(state, backend, id).await?;
    }
    Ok(())
}

async fn release<B: Backend>(state: &AppState, backend: &B, id: Uuid) -> Result<(), sqlx::Error> {
    let mut write = Write::unleased(&state.db, id).await?;
    let row = rows::load(&mut write.tx, id).await?;
    let waiting = matches!(row.status, Status::Idle | Status::RequiresAction);
    let Some(sandbox) = row.sandbox_id.filter(|_| row.owns_sandbox && waiting) else {
        return Ok(());
    };
    let Some(parts) = super::run_key::head(state, &row).await else {
        return Ok(());
    };
    let path = format!("/v1/sandboxes/{sandbox}");
    let snapshot = if row.checkpoints == "every_turn" {
        let resume = ApiRequest::post(format!("{path}/resume"), json!({}));
        let _ = backend.call(Some(&parts), resume).await;
        snapshot(backend, &parts, sandbox).await
    } else {
        None
    };
    if let Err(why) = backend.call(Some(&parts), ApiRequest::delete(path)).await {
        tracing::warn!(error = %why, "destroying a waiting agent run's sandbox failed");
    }
    sqlx::query(
        "UPDATE agent_runs SET sandbox_id = NULL, \
             checkpoint_snapshot = coalesce($2, checkpoint_snapshot) WHERE id = $1",
    )
    .bind(id)
    .bind(snapshot)
    .execute(&mut *write.tx)
    .await?;
    write
        .event(
            "sandbox.released",
            json!({ "sandbox_id": sandbox, "snapshot_id": snapshot,
                    "reason": "max_wait_secs" }),
        )
        .await?;
    if write.commit().await? {
        let _ = state.harness.events.send(id);
    }
    Ok(())
}

/// A snapshot of `sandbox` taken as the run's key; its id.
pub async fn snapshot<B: Backend>(
    backend: &B,
    parts: &http::request::Parts,
    sandbox: Uuid,
) -> Option<Uuid> {
    let path = format!("/v1/sandboxes/{sandbox}/snapshots");
    let taken = backend
        .call(Some(parts), ApiRequest::post(path, json!({})))
        .await;
    match taken {
        Ok(answer) if answer.is_success() => answer
            .json()
            .and_then(|body| body["id"].as_str().and_then(|id| id.parse().ok())),
        Ok(answer) => {
            tracing::warn!(
                status = answer.status,
                "a checkpoint of an agent run's sandbox was refused"
            );
            None
        }
        Err(why) => {
            tracing::warn!(error = %why, "taking a checkpoint of an agent run's sandbox failed");
            None
        }
    }
}
