//! Agent runs' rows, leases and dispatch: the harness's loop (`sandbase-harness` for what it
//! says to models and how tools run) driven step by step on this gateway, journaled in
//! PostgreSQL before every step.
//!
//! `lifecycle.rs`: the status enum and every change of it (the only module writing
//! `status`); `rows.rs`: a run as PostgreSQL keeps it and the reads of it; `create.rs`: a
//! new run, its own key and Idempotency-Key; `run_key.rs`: the run's key, sealed by the
//! vault; `journal.rs`: epoch-checked writes of steps, events and the conversation;
//! `lease.rs`: a gateway's lease of a run, renewed by heartbeat; `dispatch.rs`: claiming
//! runs whose lease is free or ran out; `run.rs`: a run as the gateway stepping it holds it;
//! `driver.rs` and `steps.rs`: the loop; `deltas.rs`: pieces journaled as they
//! come (a model's streamed answer, `model.delta`; a command's output, `tool.output.delta`); `mcp.rs`: the MCP tools a run offers and calls of
//! them; `remote_mcp.rs`: a remote server named by URL (the egress guard, its credential in
//! the vault); `limits.rs`: a limit reached (`limited`, or waiting for new limits) and new
//! limits posted; `cancel.rs`: a tool call watched for a cancel; `recover.rs`: what an
//! adopted run does with a step its former owner left begun (adopted, interrupted, or asked
//! about); `inputs.rs`: messages, tool results, decisions, limits and cancels sent to a run;
//! `events.rs`: reading the stream; `release.rs`: the sandboxes of runs that waited past
//! `max_wait_secs` released (snapshotted first with checkpoints), and checkpoints.

mod approvals;
mod cancel;
pub mod create;
mod deltas;
pub mod dispatch;
mod driver;
pub mod events;
pub mod inputs;
mod journal;
mod lease;
pub mod lifecycle;
mod limits;
mod mcp;
mod recover;
mod release;
mod remote_mcp;
pub mod rows;
mod run;
mod run_key;
mod steps;
