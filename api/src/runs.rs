//! Runs: a sandbox for one command, with inputs in and artifacts out.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::sandboxes::{Resources, ResourcesRequest};

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRunRequest {
    #[serde(default)]
    pub template: Option<String>,
    /// The program and its arguments (no shell).
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// A shell command line, run with `/bin/sh -c`.
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Put in `/work/in` (read-only to the command) before it starts.
    #[serde(default)]
    pub inputs: RunInputs,
    /// Seconds the command may run (default 300).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub resources: ResourcesRequest,
    /// Directory whose content is kept as the run's artifact (default `/work/out`).
    #[serde(default)]
    pub outputs: Option<String>,
    /// Hosts the run's sandbox may reach through the egress proxy (deny by default). Absent:
    /// the team's default policy, if it has one; `{"allow": []}`: loopback only.
    #[serde(default)]
    pub egress: Option<crate::sandboxes::EgressPolicy>,
    /// Vault credentials (names) the proxy adds to the run's requests to their hosts.
    #[serde(default)]
    pub credentials: Vec<String>,
    /// Isolation level of the run's sandbox (as for sandboxes).
    #[serde(default)]
    pub isolation: Option<crate::sandboxes::Isolation>,
    /// Access to the model and API store from inside the run (as for sandboxes).
    #[serde(default)]
    pub store: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunInputs {
    /// Files by relative path, with their text content.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// A tar archive, base64-encoded, unpacked into `/work/in`.
    #[serde(default)]
    pub tar_base64: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Waiting for room on a worker.
    Queued,
    Running,
    /// The command ran (whatever its exit code); artifacts are kept.
    Completed,
    /// The run could not be carried out (see `error`).
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Run {
    pub id: Uuid,
    pub template: String,
    pub cmd: Vec<String>,
    pub state: RunState,
    pub outputs: String,
    pub timeout_secs: u64,
    pub resources: Resources,
    #[serde(default)]
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    /// The command's output (the first 64 KiB of each stream).
    #[serde(default)]
    pub stdout: Option<String>,
    #[serde(default)]
    pub stderr: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    /// Size of the artifact archive (`GET /v1/runs/{id}/artifacts`).
    #[serde(default)]
    pub artifact_size: Option<u64>,
    /// The egress policy its sandbox got (`null`: loopback only).
    #[serde(default)]
    pub egress: Option<crate::sandboxes::EgressPolicy>,
    /// Vault credentials (names) its sandbox's proxy held.
    #[serde(default)]
    pub credentials: Vec<String>,
    /// Its sandbox reached the model and API store from inside.
    #[serde(default)]
    pub store: bool,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    pub runs: Vec<Run>,
}
