//! What the proxy records of every connection.

use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "decision", content = "reason", rename_all = "snake_case")]
pub enum Decision {
    Allowed,
    /// Refused, and why (shown to the sandbox and in the flow log).
    Denied(String),
    /// Allowed, but the upstream could not be reached.
    Failed(String),
}

/// One connection through the proxy.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Flow {
    pub sandbox: String,
    pub host: String,
    pub port: u16,
    /// `connect`, `http` (explicit), `transparent-http`, `transparent-tls`, `https` or `dns`.
    pub mode: String,
    pub decision: Decision,
    /// Whether its TLS was opened (a credential, or placeholders to watch).
    pub intercepted: bool,
    /// Credentials injected into its requests (names).
    pub credentials: Vec<String>,
    /// The credential whose placeholder it tried to take to another host.
    pub leak: Option<String>,
    /// The address dialed, when one was.
    pub address: Option<SocketAddr>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration: Duration,
    pub started_at: std::time::SystemTime,
}

impl Flow {
    /// A connection's flow as it starts: allowed until something says otherwise.
    pub(super) fn new(sandbox: &str, target: &super::target::Target) -> Flow {
        Flow {
            sandbox: sandbox.to_owned(),
            host: target.host.clone(),
            port: target.port,
            mode: target.mode.to_owned(),
            decision: Decision::Allowed,
            intercepted: false,
            credentials: Vec::new(),
            leak: None,
            address: None,
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::ZERO,
            started_at: std::time::SystemTime::now(),
        }
    }
}
