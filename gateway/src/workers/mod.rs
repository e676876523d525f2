//! The gateway's view of its workers: the live set that placement reads (`registry`), the
//! typed client of their internal API (`client`), their credentials (`credential`), and what their registrations and
//! heartbeats change (`reconcile`).

pub mod client;
pub mod credential;
pub mod ports;
pub mod reconcile;
pub mod registry;

pub use client::{WorkerAddress, WorkerClient, WorkerError};
pub use registry::Workers;
