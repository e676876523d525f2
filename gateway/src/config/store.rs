//! `[store]`: the model providers and paid APIs the operator offers teams through the
//! gateway, with their prices. Validated at start-up, naming the key at fault.

use std::collections::HashSet;

use sandbase_billing::Credits;
use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSettings {
    pub providers: Vec<ProviderSettings>,
    pub models: Vec<ModelSettings>,
    pub apis: Vec<ApiSettings>,
    /// MCP servers whose tools `/mcp` offers, namespaced `{name}.{tool}`.
    pub mcp_servers: Vec<McpServerSettings>,
    /// After a client went away mid-stream, how long the upstream is still read for its
    /// usage (the call is billed for what it really used).
    pub drain_secs: u64,
    /// How often credentials from a file or an operator secret are read again, so that a
    /// rotation reaches a running gateway (0: only at start-up).
    pub credentials_refresh_secs: u64,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            providers: Vec::new(),
            models: Vec::new(),
            apis: Vec::new(),
            mcp_servers: Vec::new(),
            drain_secs: 120,
            credentials_refresh_secs: 30,
        }
    }
}

/// The wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    Openai,
    Anthropic,
    OpenaiCompatible,
}

impl ProviderKind {
    /// The family of routes it serves: `openai` or `anthropic`.
    pub fn family(self) -> &'static str {
        match self {
            ProviderKind::Openai | ProviderKind::OpenaiCompatible => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    pub name: String,
    pub kind: ProviderKind,
    /// The API's root: `https://api.openai.com/v1` (OpenAI-shaped: paths such as
    /// `chat/completions` follow) or `https://api.anthropic.com` (`/v1/messages` follows).
    pub base_url: String,
    /// The environment variable holding the operator's key for it.
    #[serde(default)]
    pub credential_env: Option<String>,
    /// Or a file holding it (a mounted secret), read at start-up.
    #[serde(default)]
    pub credential_file: Option<std::path::PathBuf>,
    /// Or the name of an operator secret in the vault (`sandbase vault secret set NAME`),
    /// read at start-up.
    #[serde(default)]
    pub credential_secret: Option<String>,
    /// Seconds a call may take, streams included.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Seconds to connect.
    #[serde(default = "default_connect_timeout_secs")]
    pub connect_timeout_secs: u64,
}

fn default_timeout_secs() -> u64 {
    600
}

fn default_connect_timeout_secs() -> u64 {
    10
}

/// A model teams may call, and its prices in credits per million tokens (decimal strings).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// The public id, such as `openai/gpt-4o-mini` or `anthropic/claude-sonnet-4-5`.
    pub id: String,
    pub provider: String,
    /// The provider's own name for it.
    pub upstream: String,
    pub context_window: u64,
    /// Output tokens assumed when a request sets no maximum.
    pub max_output: u64,
    pub input: String,
    #[serde(default = "zero")]
    pub cached_input: String,
    #[serde(default = "zero")]
    pub cache_write: String,
    pub output: String,
}

fn zero() -> String {
    "0".to_owned()
}

/// A paid API forwarded at `/store/apis/{name}/…` with the operator's credential.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    pub name: String,
    /// Where `/store/apis/{name}/PATH` goes: `{base_url}/PATH`.
    pub base_url: String,
    #[serde(default)]
    pub credential_env: Option<String>,
    #[serde(default)]
    pub credential_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub credential_secret: Option<String>,
    /// Where the credential goes: `bearer` (`Authorization: Bearer …`), `header:NAME` or
    /// `query:NAME`.
    #[serde(default)]
    pub inject: Injection,
    /// Credits per call (decimal string).
    pub price_per_call: String,
    /// Credits per MiB of answer (decimal string).
    #[serde(default = "zero")]
    pub price_per_mib: String,
    /// The largest answer passed on (bytes); the reservation covers it.
    #[serde(default = "default_max_response")]
    pub max_response_bytes: u64,
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
}

/// An operator's MCP server (Streamable HTTP): its tools are offered on `/mcp` as
/// `{name}.{tool}`, each call forwarded with the operator's credential and priced per call.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSettings {
    pub name: String,
    /// Its Streamable HTTP endpoint (`https://mcp.example.com/mcp`).
    pub url: String,
    #[serde(default)]
    pub credential_env: Option<String>,
    #[serde(default)]
    pub credential_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub credential_secret: Option<String>,
    /// Where the credential goes: `bearer` or `header:NAME`.
    #[serde(default)]
    pub inject: Injection,
    /// Credits per tool call (decimal string).
    pub price_per_call: String,
    /// How long a call (or listing its tools) may take; a slower one is a tool error.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
}

/// Where an upstream's credential goes, parsed once from the configuration's text
/// (`bearer`, `header:NAME`, `query:NAME`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub enum Injection {
    /// `Authorization: Bearer …`.
    #[default]
    Bearer,
    /// A header of its own, the credential as its value.
    Header(String),
    /// A query parameter (the client's own parameter of that name is dropped).
    Query(String),
}

impl TryFrom<String> for Injection {
    type Error = String;

    fn try_from(text: String) -> Result<Injection, String> {
        let named = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if text == "bearer" {
            return Ok(Injection::Bearer);
        }
        if let Some(name) = text.strip_prefix("header:")
            && named(name)
        {
            return Ok(Injection::Header(name.to_owned()));
        }
        if let Some(name) = text.strip_prefix("query:")
            && named(name)
        {
            return Ok(Injection::Query(name.to_owned()));
        }
        Err(format!(
            "`{text}` is not `bearer`, `header:NAME` or `query:NAME` (NAME of letters, digits, `-` and `_`)"
        ))
    }
}

impl From<Injection> for String {
    fn from(injection: Injection) -> String {
        match injection {
            Injection::Bearer => "bearer".to_owned(),
            Injection::Header(name) => format!("header:{name}"),
            Injection::Query(name) => format!("query:{name}"),
        }
    }
}

/// Where an upstream's credential comes from; at most one is set (none: the upstream needs
/// no credential).
#[derive(Debug, Clone, Copy)]
pub struct CredentialSource<'a> {
    pub env: Option<&'a str>,
    pub file: Option<&'a std::path::Path>,
    pub secret: Option<&'a str>,
}

impl CredentialSource<'_> {
    fn check(&self, key: &str) -> Result<(), ConfigError> {
        let set = [
            self.env.is_some(),
            self.file.is_some(),
            self.secret.is_some(),
        ]
        .into_iter()
        .filter(|set| *set)
        .count();
        if set > 1 {
            return Err(ConfigError(format!(
                "keys `{key}.credential_env`, `{key}.credential_file` and `{key}.credential_secret`: set one at most"
            )));
        }
        let valid_secret = |name: &str| {
            !name.is_empty()
                && name.len() <= 64
                && name.starts_with(|c: char| c.is_ascii_alphanumeric())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        };
        match self.secret {
            Some(name) if !valid_secret(name) => Err(ConfigError(format!(
                "key `{key}.credential_secret` must name an operator secret (1 to 64 letters, digits, `_`, `.` or `-`), not `{name}`"
            ))),
            _ => Ok(()),
        }
    }
}

macro_rules! credential_source {
    ($($settings:ty),*) => {$(
        impl $settings {
            pub fn credential(&self) -> CredentialSource<'_> {
                CredentialSource {
                    env: self.credential_env.as_deref(),
                    file: self.credential_file.as_deref(),
                    secret: self.credential_secret.as_deref(),
                }
            }
        }
    )*};
}

credential_source!(ProviderSettings, ApiSettings, McpServerSettings);

fn default_max_response() -> u64 {
    16 * 1024 * 1024
}

/// A model's prices in micro-credits per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenPrices {
    pub input: i64,
    pub cached_input: i64,
    pub cache_write: i64,
    pub output: i64,
}

impl ModelSettings {
    pub fn prices(&self) -> TokenPrices {
        let parse = |text: &str| Credits::parse(text).map_or(0, |credits| credits.0);
        TokenPrices {
            input: parse(&self.input),
            cached_input: parse(&self.cached_input),
            cache_write: parse(&self.cache_write),
            output: parse(&self.output),
        }
    }
}

fn not_unique(key: &str, name: &str) -> ConfigError {
    ConfigError(format!(
        "key `{key}.name` must be a unique lowercase name, not `{name}`"
    ))
}

/// What every upstream the operator names must have: a lowercase name, an http(s) URL (in
/// the field `url.0`), and at most one source for its credential.
fn check_upstream(
    key: &str,
    name: &str,
    url: (&str, &str),
    credential: CredentialSource<'_>,
) -> Result<(), ConfigError> {
    if !valid_name(name) {
        return Err(not_unique(key, name));
    }
    if !valid_url(url.1) {
        return Err(ConfigError(format!(
            "key `{key}.{}` must be an http:// or https:// URL",
            url.0
        )));
    }
    credential.check(key)
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn valid_url(url: &str) -> bool {
    (url.starts_with("http://") || url.starts_with("https://")) && reqwest::Url::parse(url).is_ok()
}

fn price(key: String, text: &str) -> Result<(), ConfigError> {
    match Credits::parse(text) {
        Some(credits) if credits.0 >= 0 => Ok(()),
        _ => Err(ConfigError(format!(
            "key `{key}` must be a non-negative amount of credits such as \"2.50\", not `{text}`"
        ))),
    }
}

impl StoreSettings {
    /// The operator secrets the upstreams name, with the key naming each.
    pub fn credential_secrets(&self) -> Vec<(String, String)> {
        let providers =
            self.providers.iter().enumerate().map(|(index, provider)| {
                (format!("store.providers[{index}]"), provider.credential())
            });
        let apis = (self.apis.iter().enumerate())
            .map(|(index, api)| (format!("store.apis[{index}]"), api.credential()));
        let servers = (self.mcp_servers.iter().enumerate())
            .map(|(index, server)| (format!("store.mcp_servers[{index}]"), server.credential()));
        providers
            .chain(apis)
            .chain(servers)
            .filter_map(|(key, source)| {
                let name = source.secret?;
                Some((format!("{key}.credential_secret"), name.to_owned()))
            })
            .collect()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut providers = HashSet::new();
        for (index, provider) in self.providers.iter().enumerate() {
            let key = format!("store.providers[{index}]");
            if !valid_name(&provider.name) || !providers.insert(provider.name.as_str()) {
                return Err(ConfigError(format!(
                    "key `{key}.name` must be a unique lowercase name (letters, digits, - and _), not `{}`",
                    provider.name
                )));
            }
            if !valid_url(&provider.base_url) {
                return Err(ConfigError(format!(
                    "key `{key}.base_url` must be an http:// or https:// URL"
                )));
            }
            provider.credential().check(&key)?;
            if provider.timeout_secs == 0 || provider.connect_timeout_secs == 0 {
                return Err(ConfigError(format!(
                    "keys `{key}.timeout_secs` and `{key}.connect_timeout_secs` must be at least 1"
                )));
            }
        }
        self.validate_models()?;
        self.validate_apis()?;
        self.validate_mcp_servers()
    }

    fn validate_models(&self) -> Result<(), ConfigError> {
        let mut ids = HashSet::new();
        for (index, model) in self.models.iter().enumerate() {
            let key = format!("store.models[{index}]");
            let id_ok = !model.id.is_empty()
                && model.id.len() <= 128
                && model.id.bytes().all(|b| b.is_ascii_graphic());
            if !id_ok || !ids.insert(model.id.as_str()) {
                return Err(ConfigError(format!(
                    "key `{key}.id` must be a unique id without spaces, such as openai/gpt-4o-mini"
                )));
            }
            if !self.providers.iter().any(|p| p.name == model.provider) {
                return Err(ConfigError(format!(
                    "key `{key}.provider`: no provider named `{}` in `store.providers`",
                    model.provider
                )));
            }
            if model.upstream.is_empty() || model.context_window == 0 || model.max_output == 0 {
                return Err(ConfigError(format!(
                    "keys `{key}.upstream` (not empty), `{key}.context_window` and `{key}.max_output` (at least 1)"
                )));
            }
            price(format!("{key}.input"), &model.input)?;
            price(format!("{key}.cached_input"), &model.cached_input)?;
            price(format!("{key}.cache_write"), &model.cache_write)?;
            price(format!("{key}.output"), &model.output)?;
        }
        Ok(())
    }

    fn validate_apis(&self) -> Result<(), ConfigError> {
        let mut names = HashSet::new();
        for (index, api) in self.apis.iter().enumerate() {
            let key = format!("store.apis[{index}]");
            if !names.insert(api.name.as_str()) {
                return Err(not_unique(&key, &api.name));
            }
            check_upstream(
                &key,
                &api.name,
                ("base_url", &api.base_url),
                api.credential(),
            )?;
            if api.timeout_secs == 0 || api.max_response_bytes == 0 {
                return Err(ConfigError(format!(
                    "keys `{key}.timeout_secs` and `{key}.max_response_bytes` must be at least 1"
                )));
            }
            price(format!("{key}.price_per_call"), &api.price_per_call)?;
            price(format!("{key}.price_per_mib"), &api.price_per_mib)?;
        }
        Ok(())
    }

    fn validate_mcp_servers(&self) -> Result<(), ConfigError> {
        let mut names = HashSet::new();
        for (index, server) in self.mcp_servers.iter().enumerate() {
            let key = format!("store.mcp_servers[{index}]");
            if !names.insert(server.name.as_str()) {
                return Err(not_unique(&key, &server.name));
            }
            check_upstream(
                &key,
                &server.name,
                ("url", &server.url),
                server.credential(),
            )?;
            if matches!(server.inject, Injection::Query(_)) {
                return Err(ConfigError(format!(
                    "key `{key}.inject` must be `bearer` or `header:NAME`"
                )));
            }
            if server.timeout_secs == 0 {
                return Err(ConfigError(format!(
                    "key `{key}.timeout_secs` must be at least 1"
                )));
            }
            price(format!("{key}.price_per_call"), &server.price_per_call)?;
        }
        Ok(())
    }
}
