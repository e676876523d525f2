//! The internal API between the gateway and its workers (authenticated by the node token).
//! Not part of the public contract: both sides are released together.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::sandboxes::{Isolation, Mount, Resources, RunAs};

/// A worker announcing itself. A worker registers after its start-up reconciliation, so
/// it hosts nothing yet: every sandbox the gateway routed to it before is lost.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterWorker {
    pub id: String,
    /// Where the gateway reaches this worker's internal API.
    pub url: String,
    pub capacity: u32,
    pub templates: Vec<TemplateInfo>,
    /// Volumes sandboxes may mount.
    #[serde(default)]
    pub volumes: Vec<VolumeInfo>,
    /// Isolation levels it offers.
    #[serde(default = "runc_only")]
    pub isolations: Vec<Isolation>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    pub name: String,
    pub writable: bool,
    /// The teams that may mount a writable volume writable (nobody else may).
    #[serde(default)]
    pub writers: Vec<Uuid>,
}

fn runc_only() -> Vec<Isolation> {
    vec![Isolation::Runc]
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateInfo {
    pub name: String,
    /// Started sandboxes waiting in this template's warm pool.
    pub warm: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    pub id: String,
    pub url: String,
    pub capacity: u32,
    pub templates: Vec<TemplateInfo>,
    #[serde(default)]
    pub volumes: Vec<VolumeInfo>,
    /// Every sandbox this worker hosts.
    pub sandboxes: Vec<Uuid>,
    /// Those of them that are paused (by the gateway, or by themselves when idle).
    #[serde(default)]
    pub paused: Vec<Uuid>,
    /// Whether its creates succeed (false after several failed in a row): the gateway
    /// places nothing on an unhealthy worker.
    #[serde(default = "healthy")]
    pub healthy: bool,
    /// Memory (MiB) sandboxes may reserve on it, and what they reserve now.
    #[serde(default)]
    pub memory_mb: u64,
    #[serde(default)]
    pub reserved_memory_mb: u64,
    /// CPU (millicores) sandboxes may reserve on it, and what they reserve now.
    #[serde(default)]
    pub cpu_millis: u64,
    #[serde(default)]
    pub reserved_cpu_millis: u64,
    #[serde(default = "runc_only")]
    pub isolations: Vec<Isolation>,
}

fn healthy() -> bool {
    true
}

/// The gateway's answer: sandboxes the worker hosts that should not exist any more
/// (destroyed, expired, or unknown), for the worker to remove.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HeartbeatReply {
    pub destroy: Vec<Uuid>,
}

/// What the gateway keeps about a live worker (in Redis, refreshed by heartbeats).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub id: String,
    pub url: String,
    pub capacity: u32,
    pub running: u32,
    pub templates: Vec<TemplateInfo>,
    #[serde(default)]
    pub volumes: Vec<VolumeInfo>,
    /// Milliseconds since the Unix epoch of the last heartbeat.
    pub seen_ms: i64,
    #[serde(default = "healthy")]
    pub healthy: bool,
    #[serde(default)]
    pub memory_mb: u64,
    #[serde(default)]
    pub reserved_memory_mb: u64,
    #[serde(default)]
    pub cpu_millis: u64,
    #[serde(default)]
    pub reserved_cpu_millis: u64,
    #[serde(default = "runc_only")]
    pub isolations: Vec<Isolation>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateSandbox {
    pub id: Uuid,
    /// The team it is for (writable volumes are offered to named teams only).
    #[serde(default)]
    pub team_id: Option<Uuid>,
    pub template: String,
    pub resources: Resources,
    #[serde(default)]
    pub isolation: Isolation,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Egress through the node's proxy; loopback only when absent.
    #[serde(default)]
    pub egress: Option<crate::sandboxes::EgressPolicy>,
    /// Decrypted credentials for the node's egress proxy (memory only on the worker).
    #[serde(default)]
    pub credentials: Vec<SandboxCredential>,
    /// Pause it after this many seconds without a call (commands, files, process I/O).
    #[serde(default)]
    pub auto_pause_after_idle_secs: Option<u64>,
    /// Its store credential, for the node's egress proxy to add to its requests to the
    /// store host (memory only on the worker; the sandbox never holds it).
    #[serde(default)]
    pub store_token: Option<StoreToken>,
}

/// A sandbox's store credential. Its `Debug` leaves the value out.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StoreToken(pub String);

impl std::fmt::Debug for StoreToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreToken(..)")
    }
}

/// A credential handed to the sandbox's worker. Its `Debug` leaves the value out.
#[derive(Clone, Serialize, Deserialize)]
pub struct SandboxCredential {
    pub name: String,
    pub hosts: Vec<String>,
    pub inject: crate::secrets::Injection,
    pub value: String,
}

impl std::fmt::Debug for SandboxCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCredential")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Exec {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: RunAs,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub background: bool,
    /// Run in this shell session (see the public `ExecRequest`).
    #[serde(default)]
    pub session: Option<String>,
    /// The caller's name for the command (see the public `ExecRequest`).
    #[serde(default)]
    pub exec_id: Option<String>,
    /// Record the command and its output for this key or person (the gateway sets it for
    /// calls of its API; a run's own commands are not recorded).
    #[serde(default)]
    pub record: Option<RecordFor>,
}

impl Exec {
    /// `argv` run as `user`, with the sandbox's environment and directory, no input, no
    /// timeout, not recorded.
    pub fn new(argv: Vec<String>, user: RunAs) -> Exec {
        Exec {
            argv,
            env: BTreeMap::new(),
            cwd: None,
            user,
            stdin: None,
            timeout_ms: None,
            stream: false,
            background: false,
            session: None,
            exec_id: None,
            record: None,
        }
    }
}

/// Who a recorded command was run by.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct RecordFor {
    pub api_key_id: Option<uuid::Uuid>,
    pub user_id: Option<uuid::Uuid>,
}

/// The header of a whole recording a worker sends (a command's, once it ended): what it
/// recorded, as JSON; the body is the asciicast document.
pub const RECORDING_HEADER: &str = "x-sandbase-recording";

/// A command a worker recorded whole: `exec` (a call of its own) or `shell` (a command of a
/// shell session, named).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommandRecording {
    pub sandbox: uuid::Uuid,
    pub kind: String,
    pub command: Vec<String>,
    #[serde(default)]
    pub shell_session: Option<String>,
    pub by: RecordFor,
    pub duration_ms: u64,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// The header carrying a worker's credential on internal calls (both directions: a worker
/// presents its own to the gateway, the gateway presents the worker's to it).
pub const NODE_TOKEN_HEADER: &str = "x-sandbase-node-token";

/// Worker credentials are `swc_<worker id>.<tag>`: the gateway derives the tag from the
/// deployment's node secret and the id; a worker holds only its own credential.
pub const WORKER_CREDENTIAL_PREFIX: &str = "swc_";

/// The worker a credential names (whether it is genuine only the gateway can tell).
pub fn credential_worker_id(credential: &str) -> Option<&str> {
    let rest = credential.strip_prefix(WORKER_CREDENTIAL_PREFIX)?;
    let (worker_id, tag) = rest.rsplit_once('.')?;
    (!worker_id.is_empty() && !tag.is_empty()).then_some(worker_id)
}

/// The protocol a worker's port connection upgrades to: raw bytes to and from the port.
pub const PORT_UPGRADE: &str = "sandbase-tcp";

/// The paths of the internal API, one function each, used by the routers that serve them
/// (with `{id}`-style placeholders as arguments, which gives the route pattern) and by the
/// clients that call them (with the real values). Path segments given here are ids and
/// template names, which need no encoding; query parameters are added by the clients'
/// encoders, never by formatting.
pub mod paths {
    pub const WORKER_REGISTER: &str = "/internal/v1/workers/register";
    pub const WORKER_HEARTBEAT: &str = "/internal/v1/workers/heartbeat";
    pub const USAGE: &str = "/internal/v1/usage";
    pub const HEALTH: &str = "/internal/v1/health";
    pub const SANDBOXES: &str = "/internal/v1/sandboxes";

    pub fn sandbox(id: &str) -> String {
        format!("{SANDBOXES}/{id}")
    }

    /// A sandbox's sub-resource: `exec`, `processes`, `files`, `archive`, `egress`,
    /// `egress-policy`.
    pub fn sandbox_part(id: &str, part: &str) -> String {
        format!("{SANDBOXES}/{id}/{part}")
    }

    pub fn process(id: &str, pid: &str) -> String {
        format!("{SANDBOXES}/{id}/processes/{pid}")
    }

    /// The code endpoint (`part` empty), its `contexts`, or `contexts/ID[/interrupt]`.
    pub fn code(id: &str, part: &str) -> String {
        if part.is_empty() {
            format!("{SANDBOXES}/{id}/code")
        } else {
            format!("{SANDBOXES}/{id}/code/{part}")
        }
    }

    /// A named command (`part` empty) or its `cancel`.
    pub fn exec(id: &str, exec_id: &str, part: &str) -> String {
        if part.is_empty() {
            format!("{SANDBOXES}/{id}/execs/{exec_id}")
        } else {
            format!("{SANDBOXES}/{id}/execs/{exec_id}/{part}")
        }
    }

    /// A background process's `stdin` or `signal`.
    pub fn process_part(id: &str, pid: &str, part: &str) -> String {
        format!("{SANDBOXES}/{id}/processes/{pid}/{part}")
    }

    /// A terminal session (`part` empty) or its `output`, `input` or `resize`.
    pub fn terminal(id: &str, session: &str, part: &str) -> String {
        if part.is_empty() {
            format!("{SANDBOXES}/{id}/pty/{session}")
        } else {
            format!("{SANDBOXES}/{id}/pty/{session}/{part}")
        }
    }

    /// A connection to `port` on a sandbox's loopback (an upgrade to [`super::PORT_UPGRADE`]).
    pub fn port(id: &str, port: &str) -> String {
        format!("{SANDBOXES}/{id}/ports/{port}")
    }

    /// A recording sent whole (a command's).
    pub fn recording_whole(id: &str) -> String {
        format!("/internal/v1/recordings/{id}")
    }

    /// Chunk `chunk` of a recording, or (`chunk` empty) its end.
    pub fn recording(id: &str, chunk: &str) -> String {
        if chunk.is_empty() {
            format!("/internal/v1/recordings/{id}/end")
        } else {
            format!("/internal/v1/recordings/{id}/chunks/{chunk}")
        }
    }

    pub fn template(name: &str) -> String {
        format!("/internal/v1/templates/{name}")
    }

    pub fn template_pull(name: &str) -> String {
        format!("/internal/v1/templates/{name}/pull")
    }
}

/// How a recorded session ended, as its worker reports it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct RecordingEnd {
    pub duration_ms: u64,
    pub bytes: u64,
    pub chunks: u32,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// What the operator asks every worker to pull as a template.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullTemplate {
    pub reference: String,
    #[serde(default)]
    pub insecure_registries: Vec<String>,
}

/// Usage a worker reports. The gateway answers 200 only once every sample and event is
/// written to PostgreSQL; a worker keeps what was not acknowledged and sends it again
/// (resends change nothing).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UsageReport {
    pub worker: String,
    #[serde(default)]
    pub samples: Vec<UsageSample>,
    #[serde(default)]
    pub events: Vec<UsageEvent>,
    /// Security events the node saw for its sandboxes (egress refused, a credential's
    /// placeholder stopped), for the team's audit log.
    #[serde(default)]
    pub audit: Vec<NodeAuditEvent>,
}

/// An audit event raised on a node about one of its sandboxes; `key` makes resends no-ops.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeAuditEvent {
    pub key: String,
    pub sandbox: Uuid,
    /// `sandbox.egress_denied` or `sandbox.credential_leak_blocked`.
    pub action: String,
    pub details: serde_json::Value,
    pub occurred_at: chrono::DateTime<chrono::Utc>,
}

/// A running sandbox's cumulative counters since it became the team's. `seq` grows by one
/// per sample of the sandbox, so `(sandbox, seq)` identifies a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageSample {
    pub sandbox: Uuid,
    pub seq: u64,
    /// Wall time since the sandbox was handed to its team, in milliseconds.
    pub uptime_ms: u64,
    /// CPU time used by the sandbox's cgroup since then, in microseconds.
    pub cpu_usec: u64,
    /// How much of `uptime_ms` it spent paused (charged for its memory only).
    #[serde(default)]
    pub paused_ms: u64,
    /// The last sample, taken when the sandbox was destroyed.
    #[serde(default)]
    pub last: bool,
    pub sampled_at: chrono::DateTime<chrono::Utc>,
}

/// A discrete quantity of usage by a sandbox (egress bytes, API calls, model tokens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageEvent {
    /// Unique per event: a resend with the same key changes nothing.
    pub key: String,
    pub sandbox: Uuid,
    pub kind: String,
    #[serde(default)]
    pub subject: String,
    pub quantity: u64,
    pub occurred_at: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct UsageReceipt {
    /// Samples and events written now (resends and unknown sandboxes are not counted).
    pub samples: u64,
    pub events: u64,
}
