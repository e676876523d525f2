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
    /// (default an hour).
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
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
