//! Background processes of a hosted sandbox and what the worker keeps of them: their output
//! tails (in the worker's own memory, outside every cgroup), counted against a budget per
//! sandbox and a ceiling per worker, and how many are kept at all.
//!
//! A sandbox runs at most [`MAX_RUNNING`] background processes at once; the worker keeps at
//! most [`MAX_EXITED`] exited ones, each for [`EXITED_TTL`] after its exit (the oldest go
//! first). A process's output beyond its own limit, the sandbox's budget or the worker's
//! ceiling drops its oldest bytes, so whatever a sandbox prints, the worker holds at most
//! the budget for it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sandbase_agent::protocol::ExitInfo;

use crate::agent_client::Stdin;
use crate::error::NodeError;

/// Background processes running at once in one sandbox. Each holds one of the agent's 16
/// connections while it runs; four stay free for commands, files and health checks.
pub const MAX_RUNNING: usize = 12;
/// Exited background processes kept (with their output) per sandbox.
pub const MAX_EXITED: usize = 64;
/// How long an exited background process is kept.
pub const EXITED_TTL: Duration = Duration::from_secs(600);
/// Most output the worker keeps for one sandbox's background processes.
pub const SANDBOX_OUTPUT_BUDGET: usize = 16 * 1024 * 1024;
/// Most output the worker keeps for all its sandboxes' background processes.
pub const WORKER_OUTPUT_CEILING: usize = 512 * 1024 * 1024;

/// Bytes of output kept: one counter per sandbox and one per worker, each with its limit.
#[derive(Clone, Debug)]
pub struct OutputBudget {
    sandbox: Arc<Retained>,
    worker: Arc<Retained>,
}

#[derive(Debug)]
pub struct Retained {
    bytes: AtomicUsize,
    limit: usize,
}

impl Retained {
    pub fn new(limit: usize) -> Arc<Retained> {
        Arc::new(Retained {
            bytes: AtomicUsize::new(0),
            limit,
        })
    }

    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// How many more bytes fit.
    pub(crate) fn room(&self) -> usize {
        self.limit.saturating_sub(self.bytes())
    }
}

impl OutputBudget {
    pub fn new(sandbox: Arc<Retained>, worker: Arc<Retained>) -> OutputBudget {
        OutputBudget { sandbox, worker }
    }

    /// How many more bytes the sandbox's budget and the worker's ceiling both allow.
    pub(crate) fn room(&self) -> usize {
        self.sandbox.room().min(self.worker.room())
    }

    pub(crate) fn add(&self, bytes: usize) {
        self.sandbox.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.worker.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn remove(&self, bytes: usize) {
        self.sandbox.bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.worker.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A command started in the background: its output so far, its exit, its open stdin.
pub struct Background {
    pub pid: u32,
    pub argv: Vec<String>,
    pub started_at: DateTime<Utc>,
    state: Mutex<BackgroundState>,
    pub(crate) stdin: tokio::sync::Mutex<Option<Stdin>>,
    /// Most bytes kept per stream.
    limit: usize,
    budget: OutputBudget,
}

#[derive(Default)]
pub(crate) struct BackgroundState {
    pub(crate) stdout: VecDeque<u8>,
    pub(crate) stderr: VecDeque<u8>,
    pub(crate) exit: Option<ExitInfo>,
    exited_at: Option<Instant>,
}

/// Which stream output came on.
#[derive(Clone, Copy)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Background {
    pub fn new(
        pid: u32,
        argv: Vec<String>,
        stdin: Option<Stdin>,
        limit: usize,
        budget: OutputBudget,
    ) -> Background {
        Background {
            pid,
            argv,
            started_at: Utc::now(),
            state: Mutex::new(BackgroundState::default()),
            stdin: tokio::sync::Mutex::new(stdin),
            limit,
            budget,
        }
    }

    /// Keeps `bytes` at the end of the stream's tail, within the process's limit and what
    /// the sandbox's budget and the worker's ceiling still allow.
    pub fn append(&self, stream: Stream, bytes: &[u8]) {
        let mut state = self.lock();
        let buffer = match stream {
            Stream::Stdout => &mut state.stdout,
            Stream::Stderr => &mut state.stderr,
        };
        let before = buffer.len();
        let room = self.budget.sandbox.room().min(self.budget.worker.room()) + before;
        let keep = self.limit.min(room);
        let fresh = &bytes[bytes.len().saturating_sub(keep)..];
        buffer.extend(fresh);
        let excess = buffer.len().saturating_sub(keep);
        buffer.drain(..excess);
        let after = buffer.len();
        if after > before {
            self.budget.add(after - before);
        } else {
            self.budget.remove(before - after);
        }
    }

    pub fn exited(&self, exit: ExitInfo) {
        let mut state = self.lock();
        state.exit.get_or_insert(exit);
        state.exited_at.get_or_insert_with(Instant::now);
    }

    pub fn running(&self) -> bool {
        self.lock().exit.is_none()
    }

    fn exited_at(&self) -> Option<Instant> {
        self.lock().exited_at
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, BackgroundState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let state = self.lock();
        let kept = state.stdout.len() + state.stderr.len();
        drop(state);
        self.budget.remove(kept);
    }
}

/// Makes room for one more background process in `processes`: exited ones past their TTL
/// or beyond [`MAX_EXITED`] (the oldest first) are forgotten; refused when
/// [`MAX_RUNNING`] still run.
pub fn make_room(processes: &mut HashMap<u32, Arc<Background>>) -> Result<(), NodeError> {
    let now = Instant::now();
    processes.retain(|_, process| {
        process
            .exited_at()
            .is_none_or(|at| now.duration_since(at) < EXITED_TTL)
    });
    let mut exited: Vec<(Instant, u32)> = processes
        .values()
        .filter_map(|process| process.exited_at().map(|at| (at, process.pid)))
        .collect();
    if exited.len() >= MAX_EXITED {
        exited.sort_unstable();
        for (_, pid) in &exited[..=exited.len() - MAX_EXITED] {
            processes.remove(pid);
        }
    }
    if processes.values().filter(|p| p.running()).count() >= MAX_RUNNING {
        return Err(NodeError::TooManyProcesses(MAX_RUNNING));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit() -> ExitInfo {
        ExitInfo {
            code: 0,
            signal: None,
            timed_out: false,
            duration_ms: 0,
        }
    }

    #[test]
    fn output_stays_within_the_process_limit_the_sandbox_budget_and_the_worker_ceiling() {
        let worker = Retained::new(5_000);
        let sandbox = Retained::new(3_000);
        let budget = OutputBudget::new(Arc::clone(&sandbox), Arc::clone(&worker));
        let first = Background::new(1, vec![], None, 2_000, budget.clone());
        first.append(Stream::Stdout, &[b'a'; 10_000]);
        assert_eq!(first.lock().stdout.len(), 2_000);
        first.append(Stream::Stderr, &[b'b'; 10_000]);
        // The sandbox's budget leaves 1 000 for the second stream.
        assert_eq!(first.lock().stderr.len(), 1_000);
        assert_eq!(sandbox.bytes(), 3_000);
        let second = Background::new(2, vec![], None, 2_000, budget.clone());
        second.append(Stream::Stdout, b"more");
        assert_eq!(second.lock().stdout.len(), 0);
        // Another sandbox is held by the worker's ceiling.
        let other = Retained::new(3_000);
        let third = Background::new(
            3,
            vec![],
            None,
            2_000,
            OutputBudget::new(Arc::clone(&other), Arc::clone(&worker)),
        );
        third.append(Stream::Stdout, &[b'c'; 10_000]);
        assert_eq!(third.lock().stdout.len(), 2_000);
        assert_eq!(worker.bytes(), 5_000);
        // Forgetting a process gives its bytes back.
        drop(first);
        assert_eq!(sandbox.bytes(), 0);
        assert_eq!(worker.bytes(), 2_000);
    }

    #[test]
    fn exited_processes_are_forgotten_and_running_ones_capped() {
        let budget = OutputBudget::new(Retained::new(1 << 20), Retained::new(1 << 20));
        let mut processes = HashMap::new();
        for pid in 0..(MAX_EXITED as u32 + 10) {
            make_room(&mut processes).unwrap();
            let process = Arc::new(Background::new(pid, vec![], None, 10, budget.clone()));
            process.exited(exit());
            processes.insert(pid, process);
        }
        make_room(&mut processes).unwrap();
        assert_eq!(processes.len(), MAX_EXITED - 1);
        assert!(!processes.contains_key(&0), "the oldest went first");
        for pid in 1_000..(1_000 + MAX_RUNNING as u32) {
            make_room(&mut processes).unwrap();
            processes.insert(
                pid,
                Arc::new(Background::new(pid, vec![], None, 10, budget.clone())),
            );
        }
        assert!(matches!(
            make_room(&mut processes),
            Err(NodeError::TooManyProcesses(_))
        ));
    }
}
