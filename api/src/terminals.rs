//! Terminal (PTY) sessions: the public wire types.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::sandboxes::RunAs;

/// A terminal to open in a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenTerminalRequest {
    #[serde(default = "default_cols")]
    pub cols: u16,
    #[serde(default = "default_rows")]
    pub rows: u16,
    /// The program and its arguments; a login shell (bash when the template has it) when
    /// absent.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// Working directory; the sandbox's when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Environment on top of the sandbox's (`TERM` is `xterm-256color` unless set here).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub user: RunAs,
    /// The session ends after this many seconds with no client attached and no input
    /// (default an hour; 1 to 86 400).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86_400)]
    pub idle_timeout_secs: Option<u64>,
    /// Record the session (asciicast v2, kept with the audit log). `false` keeps no
    /// recording: the open is audited, the close is not.
    #[serde(default = "record_by_default")]
    pub record: bool,
    /// Record what is typed as well as what is shown. By default the keystrokes of admins'
    /// and owners' sessions are recorded and members' are not (a member's typing may be a
    /// password) unless the team's `record_members_input` setting says so; `true` or
    /// `false` decides for this session.
    #[serde(default)]
    pub record_input: Option<bool>,
    /// Set by the gateway for the worker: the recording this session writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub recording: Option<uuid::Uuid>,
}

fn record_by_default() -> bool {
    true
}

fn default_cols() -> u16 {
    80
}

fn default_rows() -> u16 {
    24
}

/// A terminal session of a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Terminal {
    pub session_id: u32,
    /// Its command's pid in the sandbox.
    pub pid: u32,
    pub cols: u16,
    pub rows: u16,
    pub command: Vec<String>,
    pub created_at: DateTime<Utc>,
    /// Output so far, in bytes (the offset a client attaching now starts at).
    pub output_bytes: u64,
    /// Set once its command exited.
    #[serde(default)]
    pub exit_code: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TerminalList {
    pub terminals: Vec<Terminal>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeRequest {
    pub cols: u16,
    pub rows: u16,
}

/// A single-use ticket for a browser's WebSocket (which cannot send headers): valid for
/// about 30 seconds, for this session's attach only.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AttachTicket {
    pub ticket: String,
    pub expires_at: DateTime<Utc>,
}

/// A recording (asciicast v2) of a terminal session (output, resizes, and input unless the
/// session opted out), of an `exec` call or of a shell session's command (the command line
/// as input, then its output), readable after its sandbox is gone until it expires.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Recording {
    pub id: uuid::Uuid,
    pub sandbox_id: uuid::Uuid,
    /// `terminal`, `exec` or `shell`.
    pub kind: String,
    /// The terminal session's number in its sandbox.
    pub session_id: Option<u32>,
    /// The shell session a `shell` recording's command ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell_session: Option<String>,
    pub command: Vec<String>,
    pub with_input: bool,
    pub started_at: DateTime<Utc>,
    /// Set once the session ended.
    pub ended_at: Option<DateTime<Utc>>,
    pub duration_ms: Option<i64>,
    /// Size of the recording so far.
    pub bytes: i64,
    pub exit_code: Option<i32>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RecordingList {
    pub recordings: Vec<Recording>,
}
