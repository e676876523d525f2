//! After a stop has committed: the route forgotten and the sandbox removed from its worker.
//! A worker that cannot be told now is told at its next heartbeat (it lists what the
//! gateway no longer has).

use uuid::Uuid;

use super::lifecycle::{self, StopReason, Stopped};
use crate::state::AppState;

/// Forgets the routes of stopped sandboxes and removes them from their workers, all at
/// once (the caller's task waits for every worker's answer).
pub async fn remove_stopped(state: &AppState, stopped: Vec<Stopped>) {
    let removals = stopped.into_iter().map(|sandbox| async move {
        state.sandboxes.routes.forget(sandbox.id);
        if let Some(worker_id) = sandbox.worker_id {
            remove_on_worker(state, &worker_id, sandbox.id).await;
        }
    });
    futures_util::future::join_all(removals).await;
}

/// Stops a sandbox the system made (for a run) and removes it from its worker.
pub async fn destroy_for_system(state: &AppState, id: Uuid) -> anyhow::Result<()> {
    let mut connection = state.db.acquire().await?;
    let worker = lifecycle::stop_one(&mut connection, id, StopReason::Destroyed).await?;
    drop(connection);
    state.sandboxes.routes.forget(id);
    if let Some(Some(worker_id)) = worker {
        remove_on_worker(state, &worker_id, id).await;
    }
    Ok(())
}

/// Asks a worker to remove a sandbox; failures are left to the heartbeat reconciliation.
pub async fn remove_on_worker(state: &AppState, worker_id: &str, id: Uuid) {
    let Ok(worker) = state.sandboxes.workers.address_of(worker_id).await else {
        return;
    };
    if let Err(error) = state
        .sandboxes
        .worker_client
        .remove_sandbox(&worker, id)
        .await
    {
        tracing::warn!(%id, error = %error, "removing a sandbox on its worker failed");
    }
}
