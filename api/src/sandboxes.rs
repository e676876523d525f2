//! Sandboxes, commands, processes and files: the public wire types.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub use crate::execs::{ExecEvent, ExecRequest, ExecResult, ExecStatus, OutputChunk, OutputStream};

/// How a sandbox is isolated from its node.
/// - `runc`: Linux namespaces, cgroups, a seccomp allow-list and no capabilities; commands
///   call the host kernel (through the allow-list).
/// - `gvisor`: gVisor's user-space kernel serves every system call; the host kernel sees
///   only the Sentry's own small set. Slower to start and to run system-call-heavy work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    #[default]
    Runc,
    Gvisor,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Runc => "runc",
            Isolation::Gvisor => "gvisor",
        }
    }

    pub fn parse(text: &str) -> Option<Isolation> {
        match text {
            "runc" => Some(Isolation::Runc),
            "gvisor" => Some(Isolation::Gvisor),
            _ => None,
        }
    }
}

/// Resources asked for; every field falls back to the server's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesRequest {
    /// CPU cores (fractions allowed, e.g. 0.5).
    #[serde(default)]
    pub cpu: Option<f64>,
    #[serde(default)]
    pub memory_mb: Option<u32>,
    /// Size of the writable `/work` (`/tmp` gets a quarter of it).
    #[serde(default)]
    pub disk_mb: Option<u32>,
    /// Most processes (and threads) at once.
    #[serde(default)]
    pub pids: Option<u32>,
}

/// Resources a sandbox has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Resources {
    /// CPU in thousandths of a core.
    pub cpu_millis: u32,
    pub memory_mb: u32,
    pub disk_mb: u32,
    pub pids: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Template (an image imported on the workers); the server's default when absent.
    #[serde(default)]
    pub template: Option<String>,
    /// Environment of every command (a command's own `env` wins).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory of commands; `/work` when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Lifetime in seconds (default 300); extend it with `POST /v1/sandboxes/{id}/timeout`.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub resources: ResourcesRequest,
    /// Free-form labels to filter on (`GET /v1/sandboxes?metadata.key=value`).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Volumes the operator offers (`sandbase worker --volume NAME=PATH`) to mount; nothing
    /// else of the host is visible.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Isolation level; the template's default (`sandboxes.template_isolation`), else the
    /// server's (`sandboxes.default_isolation`), when absent.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    /// Spend cap of this sandbox, in credits (a decimal, e.g. "0.5"): once its runtime and
    /// usage cost this much it is stopped (`stop_reason: spend_cap`).
    #[serde(default)]
    pub max_credits: Option<String>,
    /// Hosts the sandbox may reach (through the node's egress proxy); nothing when absent.
    #[serde(default)]
    pub egress: Option<EgressPolicy>,
    /// Vault credentials (names) the egress proxy adds to the sandbox's requests for their
    /// hosts; the sandbox never sees the values. Needs `egress` allowing those hosts.
    #[serde(default)]
    pub credentials: Vec<String>,
    /// Access to the model and API store from inside: `OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`
    /// and `SANDBASE_STORE_URL` lead to `http://store.sandbase.internal`, which the node's
    /// egress proxy forwards to the store as this sandbox (billed to its team, counted against
    /// its `max_credits` and its key's); `OPENAI_API_KEY` and `ANTHROPIC_API_KEY` are
    /// placeholders. No SandBase key enters the sandbox. Variables in `env` win.
    #[serde(default)]
    pub store: bool,
    /// Pause the sandbox by itself once no command, file call or process I/O has reached it
    /// for this many seconds; the next call resumes it (its lifetime runs on meanwhile).
    #[serde(default)]
    pub auto_pause_after_idle_secs: Option<u64>,
    /// Start from this snapshot's `/work` and `/tmp` (`POST /v1/sandboxes/{id}/snapshots`),
    /// restored before the sandbox is handed over; its template unless `template` names the
    /// same one.
    #[serde(default)]
    pub snapshot: Option<Uuid>,
}

/// Deny by default: `allow` lists host patterns (`api.github.com`, `*.example.org` — its
/// subdomains, not the apex —, `host:8443`; ports 80 and 443 unless one is named), `deny`
/// overrides them. IP addresses are not patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// A volume of the node mounted into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// The volume's name on the workers.
    pub volume: String,
    /// Where it appears in the sandbox (absolute).
    pub path: String,
    /// Read-only unless the volume is writable and this is `false`.
    #[serde(default = "read_only_by_default")]
    pub read_only: bool,
}

fn read_only_by_default() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Creating,
    Running,
    /// Frozen (`POST /v1/sandboxes/{id}/pause`): its processes keep their memory but get no
    /// CPU; commands and file calls are refused (`sandbox_paused`) until it is resumed, or,
    /// when it paused itself after `auto_pause_after_idle_secs`, resume it.
    Paused,
    Stopped,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Stopped => "stopped",
        }
    }
}

impl std::str::FromStr for SandboxState {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "creating" => Ok(SandboxState::Creating),
            "running" => Ok(SandboxState::Running),
            "paused" => Ok(SandboxState::Paused),
            "stopped" => Ok(SandboxState::Stopped),
            other => Err(format!(
                "unknown state `{other}` (expected creating, running, paused or stopped)"
            )),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    pub id: Uuid,
    pub template: String,
    pub state: SandboxState,
    /// Why a stopped sandbox stopped: `destroyed`, `expired`, `failed`, `lost`,
    /// `insufficient_credits` (the team's credits ran out), `spend_cap` (its own cap or
    /// its API key's was reached) or `key_revoked` (the API key it was made with was revoked
    /// or expired).
    #[serde(default)]
    pub stop_reason: Option<String>,
    pub cwd: String,
    pub resources: Resources,
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub isolation: Isolation,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(default)]
    pub stopped_at: Option<DateTime<Utc>>,
    /// What it has cost so far, in micro-credits (charged from its usage samples).
    #[serde(default)]
    pub spent_micro: i64,
    /// Its spend cap, in micro-credits.
    #[serde(default)]
    pub max_credits_micro: Option<i64>,
    /// What it may reach; absent: nothing (loopback only).
    #[serde(default)]
    pub egress: Option<EgressPolicy>,
    /// Credentials (names) injected into its requests.
    #[serde(default)]
    pub credentials: Vec<String>,
    /// It pauses by itself after this many idle seconds.
    #[serde(default)]
    pub auto_pause_after_idle_secs: Option<u64>,
    /// It reaches the model and API store from inside (`store: true` when created).
    #[serde(default)]
    pub store: bool,
}

/// One connection a sandbox made (or tried) through the egress proxy.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EgressFlow {
    pub at: DateTime<Utc>,
    pub host: String,
    pub port: u16,
    /// `connect` (a tunnel), `http` (a plain request through the proxy), `transparent-http`
    /// or `transparent-tls` (redirected ports 80 and 443), `https` (a request inside an
    /// intercepted connection).
    pub mode: String,
    /// `allowed`, `injected` (credentials added), `denied` (by policy, the address guard or
    /// a placeholder bound elsewhere) or `failed` (upstream unreachable or untrusted).
    pub decision: String,
    /// Credentials injected (names, never values).
    #[serde(default)]
    pub credentials: Vec<String>,
    /// Why it was denied or failed.
    #[serde(default)]
    pub reason: Option<String>,
    /// The address dialed.
    #[serde(default)]
    pub address: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EgressFlowList {
    /// Oldest first; the worker keeps the last thousand.
    pub flows: Vec<EgressFlow>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendTimeoutRequest {
    /// New lifetime from now, in seconds (at most `sandboxes.max_timeout_secs`, a day by
    /// default).
    #[schema(minimum = 1)]
    pub timeout_secs: u64,
}

/// Who a command runs as: the unprivileged sandbox user (uid 1000) or the sandbox's root
/// (root inside its user namespace only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunAs {
    #[default]
    User,
    Root,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BackgroundStarted {
    pub pid: u32,
}

/// A background process and what it has written so far.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Process {
    pub pid: u32,
    pub cmd: Vec<String>,
    pub running: bool,
    #[serde(default)]
    pub exit_code: Option<i32>,
    pub started_at: DateTime<Utc>,
    /// Output so far (the last megabytes when there was more).
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<Process>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// A signal number or name (`TERM`, `SIGKILL`, `INT`, …).
    pub signal: serde_json::Value,
}

/// A file or directory inside a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileInfo {
    pub name: String,
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub modified: DateTime<Utc>,
    #[serde(default)]
    pub link_target: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DirectoryListing {
    pub path: String,
    pub entries: Vec<FileInfo>,
}

/// Signal numbers by name (with or without `SIG`), as `kill -l` lists them on Linux.
pub fn signal_number(value: &serde_json::Value) -> Option<i32> {
    const NAMES: &[(&str, i32)] = &[
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
        ("TSTP", 20),
        ("WINCH", 28),
    ];
    match value {
        serde_json::Value::Number(number) => number
            .as_i64()
            // `9.0` is the integer 9, as JSON Schema has it.
            .or_else(|| {
                number
                    .as_f64()
                    .filter(|float| float.fract() == 0.0 && float.abs() < 1e9)
                    .map(|float| float as i64)
            })
            .and_then(|number| i32::try_from(number).ok())
            .filter(|number| (1..=64).contains(number)),
        serde_json::Value::String(name) => {
            let name = name.to_ascii_uppercase();
            let name = name.strip_prefix("SIG").unwrap_or(&name);
            NAMES
                .iter()
                .find(|(known, _)| *known == name)
                .map(|(_, number)| *number)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_number_or_name() {
        assert_eq!(signal_number(&serde_json::json!(15)), Some(15));
        assert_eq!(signal_number(&serde_json::json!("SIGKILL")), Some(9));
        assert_eq!(signal_number(&serde_json::json!("int")), Some(2));
        assert_eq!(signal_number(&serde_json::json!(0)), None);
        assert_eq!(signal_number(&serde_json::json!("NOPE")), None);
        assert_eq!(signal_number(&serde_json::json!(true)), None);
    }
}

/// A template's name: 1 to 64 lowercase letters, digits, `.`, `_` or `-`, not starting with
/// `.`. One rule for creating sandboxes, importing and pulling templates, and the workers
/// that store them (the name becomes a snapshot key and a directory name on a node).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TemplateName(String);

impl TemplateName {
    /// What a valid name looks like, for error messages.
    pub const RULE: &'static str = "a template name has 1 to 64 lowercase letters, digits, `.`, `_` or `-` and does not start with `.`";

    pub fn parse(name: &str) -> Result<TemplateName, String> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && !name.starts_with('.')
            && name.bytes().all(|byte| {
                byte.is_ascii_lowercase()
                    || byte.is_ascii_digit()
                    || matches!(byte, b'.' | b'_' | b'-')
            });
        if valid {
            Ok(TemplateName(name.to_owned()))
        } else {
            Err(Self::RULE.to_owned())
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for TemplateName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod template_name_tests {
    use super::TemplateName;

    #[test]
    fn one_rule_for_every_template_name() {
        for good in [
            "base",
            "busybox",
            "python-3.12",
            "a",
            "x_y",
            "0",
            &"a".repeat(64),
        ] {
            assert!(TemplateName::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".hidden",
            "Base",
            "a/b",
            "../x",
            "a:b",
            "a b",
            "é",
            &"a".repeat(65),
            "a\0b",
        ] {
            assert!(TemplateName::parse(bad).is_err(), "{bad:?}");
        }
    }
}
