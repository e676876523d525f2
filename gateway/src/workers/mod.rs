//! The gateway's view of its workers: the live set that placement reads (`registry`), the
//! typed client of their internal API (`client`), and what their registrations and
//! heartbeats change (`reconcile`).

pub mod client;
pub mod reconcile;
pub mod registry;

pub use client::{WorkerClient, WorkerError};
pub use registry::Workers;
