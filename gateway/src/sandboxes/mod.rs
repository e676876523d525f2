//! Sandboxes: a create as every caller makes it (`create`), what callers may ask for
//! (`validate`), the one place their state changes
//! (`lifecycle`), placement on a worker (`placement`), data-plane calls passed to that
//! worker (`forward`), the sandbox → worker route cache (`route_cache`), removal after a
//! stop (`teardown`), and what a worker's registration or heartbeat changes of its
//! sandboxes (`reconcile`).

pub mod create;
pub mod forward;
pub mod lifecycle;
pub mod placement;
pub mod preview_budget;
pub mod preview_cache;
pub mod previews;
pub mod reconcile;
pub mod recordings;
pub mod route_cache;
pub mod row;
pub mod snapshots;
pub mod teardown;
pub mod terminals;
pub mod usage_cache;
pub mod validate;

pub use row::{Owner, SandboxRow, SandboxState};
pub use validate::NewSandbox;
