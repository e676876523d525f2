//! Runs: "files in, command, files out" in a sandbox of its own.
//!
//! A run is a row in PostgreSQL (the truth) and an id in a Redis queue that is fair between
//! teams: each team has its own list, and a ring of teams with queued runs is served round
//! robin, so one team's thousand runs do not starve another's one. Every gateway runs a
//! dispatcher that takes the next run only when some worker has room, claims it in
//! PostgreSQL, and carries it out: a sandbox, the inputs unpacked into `/work/in` (owned
//! by the sandbox's root, read-only to the command), the command as the sandbox user, the
//! outputs directory archived into the artifact store, the sandbox destroyed. A run whose
//! worker turns out full goes back to the front of its team's queue. The queue is a cache:
//! queued runs missing from Redis (after a flush) are put back from PostgreSQL.

pub mod dispatch;
pub mod lifecycle;
pub mod queue;
pub mod retention;
pub mod row;
pub mod store;
pub mod submit;

pub use queue::RunQueue;
pub use row::{RUN_COLUMNS, RunRow};
pub use store::ArtifactStore;
