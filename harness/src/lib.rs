//! SandBase's harness: what the agent loop says to a model and does with its answer, and
//! the tools it runs for the model — all over SandBase's public API through an
//! [`sandbase_mcp::Backend`] (in the gateway, the API router in process, with the run's own
//! key), so that authentication, limits, credits and audit apply to every step as to any
//! client's call.
//!
//! `model.rs`: a model request in either family's wire form (OpenAI chat completions,
//! Anthropic messages, through the store's routes) and its answer read back into the typed
//! conversation of `sandbase-api`; `tools.rs`: the tools' definitions for a model and their
//! execution (`shell`, `files`, `python`); `files.rs`: the `files` tool's commands;
//! `output.rs`: what a model is shown of a tool's output (capped); `prompt.rs`: SandBase's
//! own words about the sandbox; `stream.rs`: a streamed answer read
//! as it comes (its pieces, then the whole); `coalesce.rs`: those pieces gathered into
//! journal rows; `shell.rs`: a `shell` command streamed, its output passed on as it comes. The loop itself — journal, leases, limits — is the
//! gateway's (`gateway/src/harness/`), which drives these functions step by step.

pub mod approval;
pub mod coalesce;
pub mod context;
pub mod delta;
mod files;
pub mod model;
pub mod output;
pub mod prompt;
pub mod shell;
pub mod stream;
pub mod tools;

pub use model::{Family, ModelAnswer, ModelRequest, Prices};
pub use tools::{ToolKind, ToolOutcome};
