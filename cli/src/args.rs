//! What every verb shares: the global arguments (the gateway, the key, the output form) and
//! the defaults and parsers of arguments several verbs take. A leaf: it imports no module of
//! the CLI, so every verb can use it without an import loop through `main.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

#[derive(Args, Clone)]
pub struct GlobalArgs {
    /// Gateway URL for client commands.
    #[arg(long, global = true, env = "SANDBASE_URL")]
    pub url: Option<String>,
    /// API key for client commands (else SANDBASE_TOKEN, else the saved credentials).
    #[arg(long, global = true, env = "SANDBASE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print the API's JSON instead of a human summary.
    #[arg(long, global = true)]
    pub json: bool,
}

/// A listen address argument.
pub fn parse_listen(value: &str) -> Result<SocketAddr, String> {
    value
        .parse()
        .map_err(|error| format!("`{value}` is not an address like 127.0.0.1:8080: {error}"))
}

/// Where the CLI keeps state: `$XDG_STATE_HOME/sandbase` or `~/.local/state/sandbase`.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir).join("sandbase");
    }
    home_dir().join(".local/state/sandbase")
}

pub fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}
