//! Whether this node can start sandboxes: creates that fail for reasons of the node (not of
//! the request) three times in a row make it unhealthy for a while, and the gateway stops
//! placing on it (the heartbeat says so) instead of sending every tenant's creates to a node
//! that cannot start them. After [`PAUSE`] one create is let through again to find out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures in a row that make a node unhealthy.
const FAILURES: u32 = 3;
/// How long an unhealthy node is passed over before it is tried again.
const PAUSE: Duration = Duration::from_secs(30);

#[derive(Default)]
pub struct CreateHealth {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    failures_in_a_row: u32,
    last_failure: Option<Instant>,
}

impl CreateHealth {
    pub fn succeeded(&self) {
        self.lock().failures_in_a_row = 0;
    }

    pub fn failed(&self) {
        let mut state = self.lock();
        state.failures_in_a_row += 1;
        state.last_failure = Some(Instant::now());
    }

    /// Whether sandboxes should be placed here.
    pub fn healthy(&self) -> bool {
        let state = self.lock();
        state.failures_in_a_row < FAILURES
            || state.last_failure.is_none_or(|at| at.elapsed() >= PAUSE)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_failures_in_a_row_make_a_node_unhealthy_until_one_succeeds() {
        let health = CreateHealth::default();
        health.failed();
        health.failed();
        health.succeeded();
        health.failed();
        health.failed();
        assert!(health.healthy());
        health.failed();
        assert!(!health.healthy());
        health.succeeded();
        assert!(health.healthy());
    }
}
