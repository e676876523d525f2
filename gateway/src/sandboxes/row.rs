//! A sandbox as PostgreSQL keeps it, and who it belongs to.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sandbase_api::sandboxes::{EgressPolicy, Mount, Resources, Sandbox};
use uuid::Uuid;

use crate::auth::{Actor, Principal};
use crate::text_enum::text_enum;

text_enum! {
    /// Where a sandbox is in its life (the `state` column).
    pub enum SandboxState {
        Creating => "creating",
        Running => "running",
        Paused => "paused",
        Stopped => "stopped",
    }
}

text_enum! {
    /// Why a sandbox stopped (the `stop_reason` column).
    pub enum StopReason {
        /// Its owner (or the run it was made for) destroyed it.
        Destroyed => "destroyed",
        /// Its lifetime ended.
        Expired => "expired",
        /// It never started.
        Failed => "failed",
        /// Its worker went silent, restarted, or no longer has it.
        Lost => "lost",
        /// The team's credits ran out and the grace period passed.
        InsufficientCredits => "insufficient_credits",
        /// Its own or its API key's spend cap was reached.
        SpendCap => "spend_cap",
        /// The API key it was made with was revoked or expired.
        KeyRevoked => "key_revoked",
    }
}

impl SandboxState {
    pub fn to_api(self) -> sandbase_api::sandboxes::SandboxState {
        use sandbase_api::sandboxes::SandboxState as Api;
        match self {
            SandboxState::Creating => Api::Creating,
            SandboxState::Running => Api::Running,
            SandboxState::Paused => Api::Paused,
            SandboxState::Stopped => Api::Stopped,
        }
    }
}

pub const SANDBOX_COLUMNS: &str = "id, template, state, stop_reason, cwd, cpu_millis, memory_mb, \
     disk_mb, pids, metadata, mounts, created_at, expires_at, stopped_at, spent_micro, max_credits, egress, credentials, isolation, auto_pause_secs, \
     store_token_hash IS NOT NULL AS store";

#[derive(sqlx::FromRow)]
pub struct SandboxRow {
    pub id: Uuid,
    pub template: String,
    pub state: SandboxState,
    pub stop_reason: Option<StopReason>,
    pub cwd: String,
    pub cpu_millis: i32,
    pub memory_mb: i32,
    pub disk_mb: i32,
    pub pids: i32,
    pub metadata: sqlx::types::Json<BTreeMap<String, String>>,
    pub mounts: sqlx::types::Json<Vec<Mount>>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub stopped_at: Option<DateTime<Utc>>,
    pub spent_micro: i64,
    pub max_credits: Option<i64>,
    pub egress: Option<sqlx::types::Json<EgressPolicy>>,
    pub credentials: Vec<String>,
    pub isolation: String,
    pub auto_pause_secs: Option<i32>,
    pub store: bool,
}

impl SandboxRow {
    pub fn to_api(&self) -> Sandbox {
        Sandbox {
            id: self.id,
            template: self.template.clone(),
            state: self.state.to_api(),
            stop_reason: self.stop_reason.map(|reason| reason.as_str().to_owned()),
            cwd: self.cwd.clone(),
            resources: Resources {
                cpu_millis: self.cpu_millis as u32,
                memory_mb: self.memory_mb as u32,
                disk_mb: self.disk_mb as u32,
                pids: self.pids as u32,
            },
            metadata: self.metadata.0.clone(),
            mounts: self.mounts.0.clone(),
            isolation: sandbase_api::sandboxes::Isolation::parse(&self.isolation)
                .unwrap_or_default(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            stopped_at: self.stopped_at,
            spent_micro: self.spent_micro,
            max_credits_micro: self.max_credits,
            egress: self.egress.as_ref().map(|policy| policy.0.clone()),
            credentials: self.credentials.clone(),
            auto_pause_after_idle_secs: self.auto_pause_secs.map(|secs| secs as u64),
            store: self.store,
        }
    }
}

/// A snapshot of a sandbox (`snapshots.rs` takes, finds and restores them).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SnapshotRow {
    pub id: Uuid,
    pub team_id: Uuid,
    pub sandbox_id: Uuid,
    pub template: String,
    pub isolation: String,
    pub size_bytes: i64,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl SnapshotRow {
    pub fn to_api(&self) -> sandbase_api::snapshots::Snapshot {
        sandbase_api::snapshots::Snapshot {
            id: self.id,
            sandbox_id: self.sandbox_id,
            template: self.template.clone(),
            isolation: sandbase_api::sandboxes::Isolation::parse(&self.isolation)
                .unwrap_or_default(),
            size_bytes: self.size_bytes,
            created_at: self.created_at,
            expires_at: self.expires_at,
        }
    }
}

/// Who a sandbox belongs to and who made it.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub team_id: Uuid,
    pub api_key_id: Option<Uuid>,
    pub user_id: Option<Uuid>,
}

impl Owner {
    pub fn of(principal: &Principal) -> Owner {
        let (api_key_id, user_id) = match &principal.actor {
            Actor::ApiKey(record) => (Some(record.id), record.created_by),
            Actor::User { id } => (None, Some(*id)),
        };
        Owner {
            team_id: principal.team_id,
            api_key_id,
            user_id,
        }
    }
}

/// A sandbox just started, and where.
pub struct Created {
    pub row: SandboxRow,
    pub worker: crate::workers::WorkerAddress,
}

/// One sandbox of a team.
pub async fn fetch(
    connection: impl sqlx::PgExecutor<'_>,
    team_id: Uuid,
    id: Uuid,
) -> Result<Option<SandboxRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = $1 AND team_id = $2"
    ))
    .bind(id)
    .bind(team_id)
    .fetch_optional(connection)
    .await
}

/// A team's sandboxes, newest first, optionally in one state and matching metadata.
pub async fn list(
    connection: impl sqlx::PgExecutor<'_>,
    team_id: Uuid,
    state: Option<SandboxState>,
    metadata: &serde_json::Map<String, serde_json::Value>,
    limit: i64,
) -> Result<Vec<SandboxRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE team_id = $1 \
           AND ($2::text IS NULL OR state = $2) AND metadata @> $3 \
         ORDER BY created_at DESC, id DESC LIMIT $4"
    ))
    .bind(team_id)
    .bind(state)
    .bind(serde_json::Value::Object(metadata.clone()))
    .bind(limit)
    .fetch_all(connection)
    .await
}
