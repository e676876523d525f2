//! Snapshots of a sandbox's state: the public wire types.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::sandboxes::Isolation;

/// A sandbox's `/work` and `/tmp` (everything it can change: its root is read-only), with
/// their modes, owners and times, kept in the artifact store. `POST /v1/sandboxes` with
/// `"snapshot": ID` starts a sandbox of the same template from it; forking is one snapshot
/// and several creates.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    pub id: Uuid,
    /// The sandbox it was taken of.
    pub sandbox_id: Uuid,
    pub template: String,
    pub isolation: Isolation,
    /// Size of its archives, metered as storage while it is kept.
    pub size_bytes: i64,
    pub created_at: DateTime<Utc>,
    /// When it is deleted (`sandboxes.snapshot_retention_secs` after it was taken).
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}
