//! The gateway's view of its workers: the live set that placement reads (`registry`), the
//! typed client of their internal API (`client`), their credentials (`credential`) and the
//! ports their sandboxes publish (`ports`). What a registration or heartbeat changes of the
//! sandboxes is `sandboxes::reconcile`, beside the lifecycle it drives.

pub mod client;
mod codes;
pub mod credential;
pub mod ports;
pub mod registry;

pub use client::{WorkerAddress, WorkerClient, WorkerError};
pub use registry::Workers;
