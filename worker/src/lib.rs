//! The SandBase worker: runs sandboxes on this node.
//!
//! So far: `spec`, the OCI runtime specification every sandbox container gets (isolation
//! decided in one place, unit-tested for its invariants). Lifecycle on containerd, templates,
//! the warm pool and networking build on it.

pub mod containerd;
pub mod spec;
