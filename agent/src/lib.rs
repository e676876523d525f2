//! The SandBase agent: PID 1 of every sandbox.
//!
//! It reaps every process in the sandbox, and serves the worker's requests (run a process,
//! read or write a file, list a directory) on a Unix socket — inside the sandbox's own
//! namespaces, so every path it resolves is a path of the sandbox, never of the host.
//! `protocol` is the wire format, shared with the worker.

mod descendants;
mod exec;
mod files;
pub mod protocol;
pub mod pty;
mod reaper;
mod reply;
pub mod server;
mod threads;
