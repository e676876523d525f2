//! What the tools take: their parameters (with the JSON schemas clients see), and the checks
//! a parameter passes before it becomes part of an API path or query.

use std::collections::BTreeMap;

use rmcp::model::CallToolResult;
use rmcp::schemars;
use serde::Deserialize;
use uuid::Uuid;

use crate::output;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CreateParams {
    /// The template (root file system) to start from; the server's default when absent.
    #[serde(default)]
    pub template: Option<String>,
    /// Seconds the sandbox lives before it is destroyed (it can be extended).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Memory in MiB.
    #[serde(default)]
    pub memory_mb: Option<u32>,
    /// Hosts it may reach (`api.github.com`, `*.example.org`); nothing when empty.
    #[serde(default)]
    pub egress_allow: Vec<String>,
    /// Vault credentials (names) the egress proxy adds to its requests for their hosts.
    #[serde(default)]
    pub credentials: Vec<String>,
    /// Give it the model store: the OpenAI and Anthropic SDKs inside work with no key.
    #[serde(default)]
    pub store: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SandboxParams {
    /// The sandbox's id (from sandbox_create or sandbox_list).
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExtendParams {
    pub sandbox_id: String,
    /// Seconds from now it should live.
    pub timeout_secs: u64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecParams {
    pub sandbox_id: String,
    /// A shell command line (run with /bin/sh -c); or give `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// The program and its arguments, no shell; or give `command`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Seconds before the command is killed.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Bash,
    Node,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunCodeParams {
    pub language: Language,
    pub code: String,
    /// Run in this sandbox; when absent a short-lived one is created (its id is returned).
    #[serde(default)]
    pub sandbox_id: Option<String>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PathParams {
    pub sandbox_id: String,
    /// An absolute path inside the sandbox.
    pub path: String,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Text,
    Base64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WriteParams {
    pub sandbox_id: String,
    /// An absolute path inside the sandbox (parents are created).
    pub path: String,
    pub content: String,
    /// `text` (UTF-8, the default) or `base64` for binary content.
    #[serde(default)]
    pub encoding: Encoding,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ListParams {
    pub sandbox_id: String,
    /// A directory inside the sandbox (`/work` when absent).
    #[serde(default)]
    pub path: Option<String>,
}

/// How long a sandbox run_code makes for itself lives.
pub const RUN_CODE_SANDBOX_SECS: u64 = 600;

/// `value` percent-encoded for a query string.
pub fn encoded(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A sandbox id as a path segment, or the tool error a malformed one gets.
pub fn sandbox_path(id: &str) -> Result<String, CallToolResult> {
    Uuid::parse_str(id.trim())
        .map(|id| format!("/v1/sandboxes/{id}"))
        .map_err(|_| {
            output::tool_error(
                400,
                "invalid_request",
                "`sandbox_id` is not a sandbox id (sandbox_list shows them)",
            )
        })
}
