//! The harness's dispatcher on each gateway: claims the runs some gateway must step —
//! queued ones, ones made ready by an input, and ones whose lease ran out (their gateway
//! died or stalled: adopted here) — up to `harness.max_concurrent` at once, and drives each
//! in a task of its own. Woken at once when this gateway made a run ready, and every second
//! for the others', for idle runs past their timeout and for runs whose key was revoked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbase_mcp::Backend;
use tokio::sync::Semaphore;
use tracing::Instrument;

use super::lease::Lease;
use super::lifecycle;
use crate::state::AppState;

pub async fn dispatch_forever<B: Backend>(state: AppState, backend: Arc<B>) {
    let slots = Arc::new(Semaphore::new(state.settings.harness.max_concurrent));
    loop {
        if let Err(error) = claim_all(&state, &backend, &slots).await {
            tracing::warn!(error = %error, "claiming agent runs failed");
        }
        tokio::select! {
            () = state.harness.wake.notified() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

async fn claim_all<B: Backend>(
    state: &AppState,
    backend: &Arc<B>,
    slots: &Arc<Semaphore>,
) -> Result<(), sqlx::Error> {
    let mut connection = state.db.acquire().await?;
    lifecycle::expire_idle(&mut connection).await?;
    lifecycle::expire_revoked(&mut connection).await?;
    drop(connection);
    super::release::release_expired(state, backend.as_ref()).await?;
    let mut connection = state.db.acquire().await?;
    let lease_secs = state.settings.harness.lease_secs;
    loop {
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            return Ok(());
        };
        let claimed_at = Instant::now();
        let Some(claim) =
            lifecycle::claim(&mut connection, &state.harness.instance, lease_secs).await?
        else {
            return Ok(());
        };
        let lease = Lease::new(claim, lease_secs, claimed_at);
        let (state, backend) = (state.clone(), backend.clone());
        let span = tracing::info_span!("agent_run", run_id = %claim.run_id, epoch = claim.epoch);
        tokio::spawn(
            async move {
                super::driver::drive(&state, backend.as_ref(), lease).await;
                drop(slot);
            }
            .instrument(span),
        );
    }
}
