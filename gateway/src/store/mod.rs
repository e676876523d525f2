//! The store: models and paid APIs the operator offers, called by teams with their SandBase
//! key. `Store` is the catalog (providers with the operator's credentials, models with their
//! prices); `usage` normalises each family's token counts; `sse` is the tap on streamed
//! answers; `meter` admits a call against the team's credits and key caps (the worst case
//! reserved in Redis) and settles it on the ledger.

pub mod allowed;
pub mod lineages;
pub mod mcp_calls;
pub mod mcp_servers;
pub mod meter;
pub mod requests;
pub mod sse;
pub mod usage;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use secrecy::{ExposeSecret, SecretString};

use crate::config::{
    ApiSettings, ModelSettings, ProviderKind, ProviderSettings, StoreSettings, TokenPrices,
};

/// A provider with the operator's credential and a client of its own (its timeouts).
pub struct Provider {
    pub settings: ProviderSettings,
    credential: Option<SecretString>,
    pub client: reqwest::Client,
}

/// A model teams may call.
pub struct Model {
    pub settings: ModelSettings,
    pub prices: TokenPrices,
    pub family: &'static str,
}

pub struct Store {
    providers: HashMap<String, Provider>,
    models: Vec<Model>,
    apis: Vec<PaidApi>,
    /// The operator's MCP servers, in the configuration's order.
    pub mcp_servers: Vec<mcp_servers::McpServer>,
    pub drain: Duration,
    /// Calling keys' lineages and model lists, read once.
    pub lineages: lineages::Lineages,
}

/// The Anthropic API version sent when the client names none.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// An operator's credential from the environment variable or the file `key` names.
fn credential(
    key: &str,
    env: Option<&String>,
    file: Option<&std::path::PathBuf>,
) -> anyhow::Result<Option<SecretString>> {
    if let Some(variable) = env {
        let value = std::env::var(variable).map_err(|_| {
            anyhow::anyhow!(
                "key `{key}.credential_env`: the environment variable {variable} is not set"
            )
        })?;
        return Ok(Some(SecretString::from(value)));
    }
    if let Some(path) = file {
        let value = std::fs::read_to_string(path)
            .with_context(|| format!("key `{key}.credential_file`: reading {}", path.display()))?;
        return Ok(Some(SecretString::from(value.trim().to_owned())));
    }
    Ok(None)
}

/// A paid API with the operator's credential and its prices in micro-credits.
pub struct PaidApi {
    pub settings: ApiSettings,
    pub credential: Option<SecretString>,
    pub client: reqwest::Client,
    pub per_call: i64,
    pub per_mib: i64,
}

impl PaidApi {
    /// What an answer of `bytes` costs: the call, and its size at the price per MiB
    /// (rounded up).
    pub fn cost(&self, bytes: u64) -> i64 {
        let size = (u128::from(bytes) * self.per_mib.max(0) as u128).div_ceil(1024 * 1024);
        self.per_call
            .saturating_add(i64::try_from(size).unwrap_or(i64::MAX))
    }
}

impl Store {
    /// The catalog from `[store]` (already validated), with each provider's credential read
    /// from the environment variable it names.
    pub fn new(settings: &StoreSettings) -> anyhow::Result<Store> {
        let mut providers = HashMap::new();
        for (index, provider) in settings.providers.iter().enumerate() {
            let key = format!("store.providers[{index}]");
            let credential = credential(
                &key,
                provider.credential_env.as_ref(),
                provider.credential_file.as_ref(),
            )?;
            let client = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(provider.connect_timeout_secs))
                .timeout(Duration::from_secs(provider.timeout_secs))
                .tcp_nodelay(true)
                .build()
                .context("building a provider's HTTP client")?;
            providers.insert(
                provider.name.clone(),
                Provider {
                    settings: provider.clone(),
                    credential,
                    client,
                },
            );
        }
        let models = settings
            .models
            .iter()
            .map(|model| Model {
                family: providers
                    .get(&model.provider)
                    .map_or("openai", |provider: &Provider| {
                        provider.settings.kind.family()
                    }),
                prices: model.prices(),
                settings: model.clone(),
            })
            .collect();
        let apis = paid_apis(settings)?;
        let mcp_servers = settings
            .mcp_servers
            .iter()
            .enumerate()
            .map(|(index, server)| {
                let key = format!("store.mcp_servers[{index}]");
                let credential = credential(
                    &key,
                    server.credential_env.as_ref(),
                    server.credential_file.as_ref(),
                )?;
                mcp_servers::McpServer::new(&key, server, credential)
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Store {
            providers,
            models,
            apis,
            mcp_servers,
            drain: Duration::from_secs(settings.drain_secs),
            lineages: lineages::Lineages::default(),
        })
    }

    /// The paid APIs, in the configuration's order.
    pub fn apis(&self) -> &[PaidApi] {
        &self.apis
    }

    pub fn api(&self, name: &str) -> Option<&PaidApi> {
        self.apis.iter().find(|api| api.settings.name == name)
    }

    /// The models, in the configuration's order.
    pub fn models(&self) -> &[Model] {
        &self.models
    }

    /// A model of `family` by its public id, or by the provider's own name when only one
    /// model of the family has it (agent tools often send bare names).
    pub fn model(&self, family: &str, id: &str) -> Option<(&Model, &Provider)> {
        let of_family = || self.models.iter().filter(|model| model.family == family);
        let model = of_family()
            .find(|model| model.settings.id == id)
            .or_else(|| {
                let mut named = of_family().filter(|model| model.settings.upstream == id);
                match (named.next(), named.next()) {
                    (Some(model), None) => Some(model),
                    _ => None,
                }
            })?;
        let provider = self.providers.get(&model.settings.provider)?;
        Some((model, provider))
    }
}

/// The paid APIs of `[store]`, each with its credential and client.
fn paid_apis(settings: &StoreSettings) -> anyhow::Result<Vec<PaidApi>> {
    let price = |text: &str| sandbase_billing::Credits::parse(text).map_or(0, |credits| credits.0);
    settings
        .apis
        .iter()
        .enumerate()
        .map(|(index, api)| {
            let key = format!("store.apis[{index}]");
            Ok(PaidApi {
                credential: credential(
                    &key,
                    api.credential_env.as_ref(),
                    api.credential_file.as_ref(),
                )?,
                client: reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(10))
                    .timeout(Duration::from_secs(api.timeout_secs))
                    .tcp_nodelay(true)
                    .build()
                    .context("building a paid API's HTTP client")?,
                per_call: price(&api.price_per_call),
                per_mib: price(&api.price_per_mib),
                settings: api.clone(),
            })
        })
        .collect()
}

impl Provider {
    /// A POST of `body` to the provider's `path` (`chat/completions`, `messages`, …) with the
    /// operator's credential; `headers` are the client's headers the family forwards.
    pub fn post(
        &self,
        path: &str,
        body: Vec<u8>,
        headers: &[(&'static str, String)],
    ) -> reqwest::RequestBuilder {
        let base = self.settings.base_url.trim_end_matches('/');
        let url = match self.settings.kind {
            ProviderKind::Anthropic => format!("{base}/v1/{path}"),
            ProviderKind::Openai | ProviderKind::OpenaiCompatible => format!("{base}/{path}"),
        };
        let mut request = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(credential) = &self.credential {
            request = match self.settings.kind {
                ProviderKind::Anthropic => request.header("x-api-key", credential.expose_secret()),
                ProviderKind::Openai | ProviderKind::OpenaiCompatible => {
                    request.bearer_auth(credential.expose_secret())
                }
            };
        }
        request
    }
}
