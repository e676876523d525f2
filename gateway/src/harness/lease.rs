//! This gateway's lease of a run: renewed by a heartbeat every third of its length, and
//! valid here only while the last renewal's deadline (counted from when it was sent, less a
//! margin) has not passed — so a gateway that was paused past its lease stops before any
//! further side effect, even before its next journal write is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::lifecycle::{self, Claim};
use crate::state::AppState;

/// What this gateway knows of its lease of one run.
pub struct Lease {
    pub claim: Claim,
    deadline: std::sync::Mutex<Instant>,
    lost: AtomicBool,
    /// The run's last step and turn as this gateway's last journal write left them: only
    /// the lease's holder changes them, so its next write numbers from them without reading
    /// the row first (the write checks them, and is refused when they moved).
    counters: std::sync::Mutex<Option<(i32, i32)>>,
    /// Held by a journal write of this lease from its start to its commit: the lease's
    /// writes (parallel tool calls') number one after the other.
    writing: Arc<tokio::sync::Mutex<()>>,
}

/// How long before its deadline a lease is no longer used here.
const MARGIN: Duration = Duration::from_secs(1);

impl Lease {
    pub fn new(claim: Claim, lease_secs: u64, claimed_at: Instant) -> Arc<Lease> {
        Arc::new(Lease {
            claim,
            deadline: std::sync::Mutex::new(claimed_at + Duration::from_secs(lease_secs)),
            lost: AtomicBool::new(false),
            counters: std::sync::Mutex::new(None),
            writing: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// The run's (last step, turn) after this gateway's last write, when known.
    pub fn counters(&self) -> Option<(i32, i32)> {
        *self
            .counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for the lease's write in progress, if any: the returned guard is the next's.
    pub async fn writing(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.writing.clone().lock_owned().await
    }

    /// Keeps what a write left (`None`: read them again before the next one).
    pub fn remember(&self, counters: Option<(i32, i32)>) {
        *self
            .counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = counters;
    }

    /// Whether this gateway may still act for the run.
    pub fn is_valid(&self) -> bool {
        let deadline = *self
            .deadline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        !self.lost.load(Ordering::Acquire) && Instant::now() + MARGIN < deadline
    }

    fn renewed(&self, sent_at: Instant, lease_secs: u64) {
        *self
            .deadline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            sent_at + Duration::from_secs(lease_secs);
    }

    pub fn lose(&self) {
        self.lost.store(true, Ordering::Release);
    }
}

/// Renews `lease` until it is lost or the returned handle is dropped (aborted).
pub fn heartbeat(state: AppState, lease: Arc<Lease>) -> AbortOnDrop {
    let lease_secs = state.settings.harness.lease_secs;
    let every = Duration::from_millis(lease_secs * 1000 / 3);
    AbortOnDrop(tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let sent_at = Instant::now();
            let renewed = match state.db.acquire().await {
                Ok(mut connection) => {
                    lifecycle::renew(&mut connection, lease.claim, lease_secs).await
                }
                Err(error) => Err(error),
            };
            match renewed {
                Ok(true) => lease.renewed(sent_at, lease_secs),
                Ok(false) => {
                    lease.lose();
                    return;
                }
                // Not renewed this time: the lease runs out unless the next try succeeds.
                Err(error) => {
                    tracing::warn!(error = %error, "renewing an agent run's lease failed")
                }
            }
        }
    }))
}

/// A task aborted when this is dropped.
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
