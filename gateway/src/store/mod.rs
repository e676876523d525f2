//! The store: models and paid APIs the operator offers, called by teams with their SandBase
//! key. `Store` is the catalog (providers with the operator's credentials, models with their
//! prices); `call` is a model call in named phases (admit → upstream request → answer →
//! settle), answering whole bodies or streams of bytes to any caller — the HTTP routes, the
//! harness; `translate` answers a family's call with the other family's model; `usage`
//! normalises each family's token counts; `sse` is the tap on streamed answers; `meter`
//! admits a call against the team's credits and key caps (the worst case reserved in Redis)
//! and settles it on the ledger.

pub mod allowed;
pub mod call;
pub mod credential;
pub mod lineages;
pub mod mcp_calls;
pub mod mcp_servers;
pub mod meter;
pub mod requests;
pub mod sse;
pub mod translate;
pub mod usage;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use secrecy::{ExposeSecret, SecretString};

use crate::config::{
    ApiSettings, ModelSettings, ProviderKind, ProviderSettings, StoreSettings, TokenPrices,
};
pub use credential::{Credential, OperatorSecrets};

/// A family of providers: the shape of its requests, answers and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Openai,
    Anthropic,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Openai => "openai",
            Family::Anthropic => "anthropic",
        }
    }
}

/// Who calls the store: who, and the sandbox calling from inside when it is one.
pub struct Caller {
    pub principal: crate::auth::Principal,
    pub sandbox: Option<uuid::Uuid>,
}

/// A provider with the operator's credential and a client of its own (its timeouts).
pub struct Provider {
    pub settings: ProviderSettings,
    credential: Arc<Credential>,
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
    /// Every upstream's credential, read again every `refresh_every` when it can change.
    credentials: Vec<Arc<Credential>>,
    refresh_every: Option<Duration>,
    refreshed: Mutex<Option<Instant>>,
}

/// The Anthropic API version sent when the client names none.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Reveals the operator secrets `[store]` names from the vault, each an error naming the key
/// that wants it when the vault is not configured or has no such secret.
pub async fn operator_secrets(
    settings: &StoreSettings,
    db: &sqlx::PgPool,
    keyring: Option<&sandbase_vault::Keyring>,
) -> anyhow::Result<OperatorSecrets> {
    let mut secrets = OperatorSecrets::new();
    let wanted = settings.credential_secrets();
    if wanted.is_empty() {
        return Ok(secrets);
    }
    let mut connection = db.acquire().await?;
    for (key, name) in wanted {
        let keyring = keyring.with_context(|| {
            format!("key `{key}`: the vault is not configured (vault.keys or vault.key_file)")
        })?;
        if secrets.contains_key(&name) {
            continue;
        }
        let value = sandbase_vault::reveal_operator_secret(&mut connection, keyring, &name)
            .await
            .map_err(|error| anyhow::anyhow!("key `{key}`: the vault: {error}"))?
            .with_context(|| {
                format!("key `{key}`: no operator secret named `{name}` (sandbase vault secret set {name})")
            })?;
        let value = String::from_utf8(value.to_vec())
            .map_err(|_| anyhow::anyhow!("key `{key}`: operator secret `{name}` is not UTF-8"))?;
        secrets.insert(name, SecretString::from(value));
    }
    Ok(secrets)
}

/// A paid API with the operator's credential and its prices in micro-credits.
pub struct PaidApi {
    pub settings: ApiSettings,
    pub credential: Arc<Credential>,
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
    /// The catalog from `[store]` (already validated), with each upstream's credential read
    /// from the environment variable, file or operator secret (in `secrets`) it names.
    pub fn new(settings: &StoreSettings, secrets: &OperatorSecrets) -> anyhow::Result<Store> {
        let mut providers = HashMap::new();
        let mut credentials = Vec::new();
        let mut load = |key: &str, source| -> anyhow::Result<Arc<Credential>> {
            let credential = Arc::new(Credential::load(key, source, secrets)?);
            credentials.push(credential.clone());
            Ok(credential)
        };
        for (index, provider) in settings.providers.iter().enumerate() {
            let key = format!("store.providers[{index}]");
            let credential = load(&key, provider.credential())?;
            let client = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(provider.connect_timeout_secs))
                .timeout(Duration::from_secs(provider.timeout_secs))
                .tcp_nodelay(true)
                // A 3xx is passed back, never followed with the operator's credential.
                .redirect(reqwest::redirect::Policy::none())
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
        let apis = settings
            .apis
            .iter()
            .enumerate()
            .map(|(index, api)| {
                paid_api(
                    api,
                    load(&format!("store.apis[{index}]"), api.credential())?,
                )
            })
            .collect::<anyhow::Result<_>>()?;
        let mcp_servers = settings
            .mcp_servers
            .iter()
            .enumerate()
            .map(|(index, server)| {
                let key = format!("store.mcp_servers[{index}]");
                let credential = load(&key, server.credential())?;
                mcp_servers::McpServer::new(&key, server, credential)
            })
            .collect::<anyhow::Result<_>>()?;
        credentials.retain(|credential| credential.refreshable());
        Ok(Store {
            providers,
            models,
            apis,
            mcp_servers,
            drain: Duration::from_secs(settings.drain_secs),
            lineages: lineages::Lineages::default(),
            credentials,
            refresh_every: (settings.credentials_refresh_secs > 0)
                .then(|| Duration::from_secs(settings.credentials_refresh_secs)),
            refreshed: Mutex::new(Some(Instant::now())),
        })
    }

    /// Reads again the credentials that come from a file or an operator secret, when
    /// `store.credentials_refresh_secs` has passed since the last time.
    pub async fn refresh_credentials(
        &self,
        db: &sqlx::PgPool,
        keyring: Option<&sandbase_vault::Keyring>,
    ) {
        let Some(every) = self.refresh_every else {
            return;
        };
        if self.credentials.is_empty() {
            return;
        }
        {
            let mut refreshed = self
                .refreshed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if refreshed.is_some_and(|at| at.elapsed() < every) {
                return;
            }
            *refreshed = Some(Instant::now());
        }
        for credential in &self.credentials {
            credential.refresh(db, keyring).await;
        }
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

/// A paid API of `[store]` with its credential and client.
fn paid_api(api: &ApiSettings, credential: Arc<Credential>) -> anyhow::Result<PaidApi> {
    let price = |text: &str| sandbase_billing::Credits::parse(text).map_or(0, |credits| credits.0);
    Ok(PaidApi {
        credential,
        client: reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(api.timeout_secs))
            .tcp_nodelay(true)
            // A 3xx is passed back, never followed with the operator's credential.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("building a paid API's HTTP client")?,
        per_call: price(&api.price_per_call),
        per_mib: price(&api.price_per_mib),
        settings: api.clone(),
    })
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
        if let Some(credential) = self.credential.get() {
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
