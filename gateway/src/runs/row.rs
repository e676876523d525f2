//! A run as PostgreSQL keeps it.

use chrono::{DateTime, Utc};
use sandbase_api::runs::Run;
use sandbase_api::sandboxes::{EgressPolicy, Resources};
use uuid::Uuid;

use crate::text_enum::text_enum;

text_enum! {
    /// Where a run is (the `state` column).
    pub enum RunState {
        Queued => "queued",
        Running => "running",
        Completed => "completed",
        Failed => "failed",
    }
}

impl RunState {
    pub fn to_api(self) -> sandbase_api::runs::RunState {
        use sandbase_api::runs::RunState as Api;
        match self {
            RunState::Queued => Api::Queued,
            RunState::Running => Api::Running,
            RunState::Completed => Api::Completed,
            RunState::Failed => Api::Failed,
        }
    }

    /// Whether the run is over (its artifact, if any, is stored).
    pub fn is_finished(self) -> bool {
        matches!(self, RunState::Completed | RunState::Failed)
    }
}

pub const RUN_COLUMNS: &str = "id, template, argv, state, outputs, timeout_secs, cpu_millis, \
     memory_mb, disk_mb, pids, exit_code, timed_out, stdout, stderr, error, artifact_size, \
     created_at, started_at, finished_at, egress, credentials, artifact_deleted_at, store";

#[derive(sqlx::FromRow)]
pub struct RunRow {
    pub id: Uuid,
    pub template: String,
    pub argv: sqlx::types::Json<Vec<String>>,
    pub state: RunState,
    pub outputs: String,
    pub timeout_secs: i32,
    pub cpu_millis: i32,
    pub memory_mb: i32,
    pub disk_mb: i32,
    pub pids: i32,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    pub error: Option<String>,
    pub artifact_size: Option<i64>,
    /// When the artifact was deleted, its retention over.
    pub artifact_deleted_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub egress: Option<sqlx::types::Json<EgressPolicy>>,
    pub credentials: Vec<String>,
    pub store: bool,
}

impl RunRow {
    pub fn to_api(&self) -> Run {
        Run {
            id: self.id,
            template: self.template.clone(),
            cmd: self.argv.0.clone(),
            state: self.state.to_api(),
            outputs: self.outputs.clone(),
            timeout_secs: self.timeout_secs as u64,
            resources: Resources {
                cpu_millis: self.cpu_millis as u32,
                memory_mb: self.memory_mb as u32,
                disk_mb: self.disk_mb as u32,
                pids: self.pids as u32,
            },
            exit_code: self.exit_code,
            timed_out: self.timed_out,
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            error: self.error.clone(),
            artifact_size: self.artifact_size.map(|size| size as u64),
            egress: self.egress.as_ref().map(|policy| policy.0.clone()),
            credentials: self.credentials.clone(),
            store: self.store,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
        }
    }
}
