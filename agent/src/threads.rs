//! The stacks of the agent's threads. Every thread's stack is memory of the sandbox (under
//! gVisor, of the Sentry's budget too), and many of them may wait at once.

/// Threads that only move bytes (standard input, terminals) and the reaper.
pub(crate) const SMALL_STACK: usize = 128 * 1024;
/// Connection threads (archives, JSON, commands).
pub(crate) const CONNECTION_STACK: usize = 512 * 1024;
