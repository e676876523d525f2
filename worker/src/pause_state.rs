//! A hosted sandbox's pause state and activity, kept with the sandbox (`pause` changes it).

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The node's clock for activity times (milliseconds since the first use).
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn now_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}

/// Why a sandbox is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The gateway asked: calls are refused until it asks to resume.
    Asked,
    /// It was idle: the next call resumes it.
    Idle,
}

/// A hosted sandbox's pause state and activity.
pub struct PauseState {
    /// Set (before the freeze) while it is paused or being paused: calls that see it take
    /// the lock and wait for the transition.
    pub(crate) paused: AtomicBool,
    /// Serialises pausing and resuming.
    pub(crate) reason: tokio::sync::Mutex<Option<Reason>>,
    /// Calls in flight (their answers included).
    pub(crate) busy: AtomicUsize,
    /// When the last call began or ended, on [`EPOCH`]'s clock.
    last_active_ms: AtomicU64,
    idle_after: Option<Duration>,
}

impl PauseState {
    pub fn new(idle_after: Option<Duration>) -> PauseState {
        PauseState {
            paused: AtomicBool::new(false),
            reason: tokio::sync::Mutex::new(None),
            busy: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(now_ms()),
            idle_after,
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    pub(crate) fn touch(&self) {
        self.last_active_ms.store(now_ms(), Ordering::SeqCst);
    }

    /// Idle for long enough to pause by itself.
    pub(crate) fn idle(&self) -> bool {
        self.idle_after.is_some_and(|after| {
            self.busy.load(Ordering::SeqCst) == 0
                && now_ms().saturating_sub(self.last_active_ms.load(Ordering::SeqCst))
                    >= after.as_millis() as u64
        })
    }
}
