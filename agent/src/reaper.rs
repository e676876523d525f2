//! The one reaper: as PID 1 the agent inherits every orphan in the sandbox, so it must reap
//! them all; it is also the parent of every process it starts and needs their exit
//! statuses. This thread is the only caller of `wait`: it hands statuses of processes the
//! agent started to whoever waits for them, and simply reaps the rest. A process that exits
//! before its starter registered it is kept in `early` until it does.

use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use rustix::process::{WaitOptions, WaitStatus};

#[derive(Default)]
pub(crate) struct Children {
    pub(crate) waiting: HashMap<u32, Sender<WaitStatus>>,
    pub(crate) early: HashMap<u32, WaitStatus>,
}

pub(crate) fn children() -> MutexGuard<'static, Children> {
    static CHILDREN: OnceLock<Mutex<Children>> = OnceLock::new();
    CHILDREN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Counts spawns, so the reaper can sleep while there is nothing to reap.
pub(crate) fn spawns() -> &'static (Mutex<u64>, Condvar) {
    static SPAWNS: OnceLock<(Mutex<u64>, Condvar)> = OnceLock::new();
    SPAWNS.get_or_init(|| (Mutex::new(0), Condvar::new()))
}

pub(crate) fn reap_forever() {
    let (count, wakeup) = spawns();
    loop {
        // Read before waiting: a spawn after this point makes the sleep below end at once.
        let seen = *count
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) => {
                let pid = pid.as_raw_nonzero().get() as u32;
                let mut children = children();
                match children.waiting.remove(&pid) {
                    Some(sender) => {
                        let _ = sender.send(status);
                    }
                    None => {
                        // Either an orphan (nobody waits) or a child whose starter has not
                        // registered yet; keep a bounded memory of the latter.
                        if children.early.len() > 10_000 {
                            children.early.clear();
                        }
                        children.early.insert(pid, status);
                    }
                }
            }
            Ok(None) => {}
            // No children: sleep until the next spawn.
            Err(_) => {
                let guard = count
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let _ =
                    wakeup.wait_timeout_while(guard, Duration::from_secs(1), |now| *now == seen);
            }
        }
    }
}
