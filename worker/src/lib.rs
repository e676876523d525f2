//! The SandBase worker: runs sandboxes on this node.
//!
//! `spec` is the OCI runtime specification every sandbox container gets (isolation decided
//! in one place; `seccomp` its system-call allow-list); `containerd` drives templates, containers and tasks; `sandboxes` is the
//! node's set of sandboxes with start-up reconciliation. The worker process, its API, the
//! warm pool and networking build on these.

pub mod agent_client;
pub mod api;
pub mod background;
pub mod code;
pub mod code_contexts;
pub mod command_recording;
pub mod containerd;
pub mod error;
pub mod exec;
pub mod gvisor;
pub mod health;
pub mod images;
pub mod namespace;
pub mod network;
pub mod node;
pub mod pause;
pub mod pause_state;
pub mod pool;
pub mod preview;
pub mod recording;
pub mod registration;
pub mod registry;
pub mod reporter;
pub mod runtime;
pub mod seccomp;
pub mod service;
pub mod session;
pub mod spec;
pub mod templates;
pub mod terminal;
pub mod terminal_sessions;
pub mod tls_listener;
pub mod tracked;
pub mod tracked_run;
pub mod usage;
pub mod utf8;
pub mod volumes;
