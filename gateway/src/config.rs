//! Typed, layered configuration: defaults, then an optional TOML file, then the
//! environment (`SANDBASE_` prefix, `__` for nesting, plus the conventional
//! `DATABASE_URL` and `REDIS_URL`). Parsed once at start-up; a bad or missing
//! value stops start-up with a message naming the key.

use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

/// Every setting of the gateway. `sandbase.example.toml` documents each key and its default.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub redis: RedisSettings,
    pub auth: AuthSettings,
    pub rate_limit: RateLimitSettings,
    pub telemetry: TelemetrySettings,
    pub sandboxes: SandboxSettings,
    pub workers: WorkerSettings,
    pub runs: RunSettings,
    pub billing: BillingSettings,
    pub stripe: StripeSettings,
    pub vault: VaultSettings,
}

/// The vault's key-encryption keys: `VERSION:BASE64` entries (32 random bytes each; make one
/// with `sandbase vault new-key`), given here or in a key file, one a line. The highest
/// version wraps new data keys; keep the older ones until `sandbase vault rotate-kek` has
/// re-wrapped everything. Without keys, the secrets API answers 501.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VaultSettings {
    #[serde(serialize_with = "serialize_secrets")]
    pub keys: Vec<SecretString>,
    pub key_file: Option<std::path::PathBuf>,
}

impl VaultSettings {
    /// The keyring, when keys are configured.
    pub fn keyring(&self) -> Result<Option<sandbase_vault::Keyring>, ConfigError> {
        let mut entries: Vec<String> = self
            .keys
            .iter()
            .map(|key| key.expose_secret().to_owned())
            .collect();
        if let Some(path) = &self.key_file {
            let text = std::fs::read_to_string(path).map_err(|error| {
                ConfigError(format!(
                    "key `vault.key_file`: cannot read {}: {error}",
                    path.display()
                ))
            })?;
            entries.extend(text.lines().map(str::to_owned));
        }
        let entries: Vec<&str> = entries
            .iter()
            .map(|entry| entry.trim())
            .filter(|entry| !entry.is_empty() && !entry.starts_with('#'))
            .collect();
        if entries.is_empty() {
            return Ok(None);
        }
        sandbase_vault::Keyring::parse(entries)
            .map(Some)
            .map_err(|error| ConfigError(format!("keys `vault.keys` / `vault.key_file`: {error}")))
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StripeSettings {
    /// Secret API key (`sk_…`). Without it, checkout answers 501 and credits come from admins.
    #[serde(serialize_with = "serialize_optional_secret")]
    pub secret_key: Option<SecretString>,
    /// The webhook endpoint's signing secret (`whsec_…`).
    #[serde(serialize_with = "serialize_optional_secret")]
    pub webhook_secret: Option<SecretString>,
    /// Stripe's API base URL (a stand-in's, in tests).
    pub api_base: String,
    /// Price of one credit, in the currency's smallest unit.
    pub unit_amount: u64,
    pub currency: String,
    /// Smallest and largest purchase, in credits.
    pub min_credits: u64,
    pub max_credits: u64,
    /// Where Checkout sends the buyer afterwards.
    pub success_url: String,
    pub cancel_url: String,
    /// Webhooks signed longer ago than this are refused.
    pub tolerance_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BillingSettings {
    /// Credits every new team starts with (a decimal, e.g. "10" or "2.5"; "0" for none).
    pub starter_credits: String,
    /// Days until the starter credits expire (0: never).
    pub starter_expiry_days: u32,
    /// Micro-credits per second of one vCPU of a sandbox's size.
    pub vcpu_second_micro: u64,
    /// Micro-credits per second of one GiB of a sandbox's memory.
    pub gib_second_micro: u64,
    /// Micro-credits per second of CPU time a sandbox used (measured in its cgroup).
    pub cpu_second_micro: u64,
    /// A running sandbox's reported usage is charged once it adds up to this many seconds
    /// (of wall or CPU time); sooner when it stops or has a spend cap.
    pub charge_every_secs: u64,
    /// Seconds a team at zero credits keeps its running sandboxes before they are stopped.
    pub grace_secs: u64,
    /// Prices of the other kinds of usage (model tokens, API calls, egress bytes): the first
    /// entry matching an event's kind and subject (`*`: any subject) prices it. An event
    /// without a price is refused when it is reported.
    pub prices: Vec<Price>,
}

/// `micro` micro-credits per `per` units of `kind` for `subject`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub kind: String,
    #[serde(default = "any_subject")]
    pub subject: String,
    pub micro: u64,
    #[serde(default = "one")]
    pub per: u64,
}

fn any_subject() -> String {
    "*".to_owned()
}

fn one() -> u64 {
    1
}

/// The kinds of usage the pipeline accepts as events.
pub const EVENT_KINDS: [&str; 4] = [
    "model_input_tokens",
    "model_output_tokens",
    "api_calls",
    "egress_bytes",
];

impl BillingSettings {
    /// The price of `quantity` units of `kind` for `subject`, rounded up; `None` when the
    /// table has no price for them.
    pub fn price_of(&self, kind: &str, subject: &str, quantity: i64) -> Option<(i64, &Price)> {
        let price = self.prices.iter().find(|price| {
            price.kind == kind && (price.subject == "*" || price.subject == subject)
        })?;
        let amount =
            (quantity.max(0) as u128 * u128::from(price.micro)).div_ceil(u128::from(price.per));
        Some((i64::try_from(amount).unwrap_or(i64::MAX), price))
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RunSettings {
    /// Where run artifacts (and the inputs of queued runs) are kept.
    pub artifacts_dir: std::path::PathBuf,
    /// Largest run request (inputs included), in bytes.
    pub input_limit_bytes: usize,
    /// Most runs one gateway carries out at once.
    pub max_concurrent: usize,
    /// An S3-compatible bucket for artifacts and inputs instead of `artifacts_dir` (needed
    /// when gateways run on several machines).
    #[serde(default)]
    pub s3: Option<S3Settings>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct S3Settings {
    pub bucket: String,
    #[serde(default = "default_region")]
    pub region: String,
    /// For S3-compatible services (MinIO, Ceph, R2…): their URL; path-style requests.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Keys are read from the environment (AWS_ACCESS_KEY_ID, …) when not set here.
    #[serde(default, serialize_with = "serialize_optional_secret")]
    pub access_key_id: Option<SecretString>,
    #[serde(default, serialize_with = "serialize_optional_secret")]
    pub secret_access_key: Option<SecretString>,
    /// Allow an `http://` endpoint.
    #[serde(default)]
    pub allow_http: bool,
    /// Prefix of every object SandBase writes.
    #[serde(default)]
    pub prefix: String,
}

fn default_region() -> String {
    "us-east-1".to_owned()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSettings {
    /// Template of sandboxes that name none.
    pub default_template: String,
    /// Lifetime of a sandbox that asks for none.
    pub default_timeout_secs: u64,
    /// Longest lifetime a sandbox may ask for (or be extended to).
    pub max_timeout_secs: u64,
    /// Resources of a sandbox that asks for none (also the size of warm sandboxes).
    pub default_resources: ResourceSettings,
    /// Most a sandbox may ask for.
    pub max_resources: ResourceSettings,
    /// Largest file or archive upload, in bytes.
    pub upload_limit_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceSettings {
    /// CPU in thousandths of a core.
    pub cpu_millis: u32,
    pub memory_mb: u32,
    /// Size of the writable /work (and a quarter of it for /tmp).
    pub disk_mb: u32,
    pub pids: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Shared secret of the gateway and its workers; internal calls carry it both ways.
    /// Without it no worker can register.
    #[serde(serialize_with = "serialize_optional_secret")]
    pub node_token: Option<SecretString>,
    /// A worker whose last heartbeat is older than this gets no new sandboxes.
    pub heartbeat_ttl_secs: u64,
    /// A worker silent for this long has lost its sandboxes.
    pub lost_after_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address the public API listens on.
    pub listen: SocketAddr,
    /// Largest accepted request body, in bytes.
    pub body_limit_bytes: usize,
    /// Take the client address from `X-Forwarded-For` (only behind a trusted load balancer).
    pub trust_forwarded_for: bool,
    /// How long in-flight requests may take to finish after SIGTERM.
    pub shutdown_grace_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// PostgreSQL URL; also read from `DATABASE_URL`.
    #[serde(serialize_with = "serialize_optional_secret")]
    pub url: Option<SecretString>,
    pub max_connections: u32,
    /// Apply pending migrations at start-up.
    pub migrate_on_start: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// Redis URL; also read from `REDIS_URL`.
    #[serde(serialize_with = "serialize_optional_secret")]
    pub url: Option<SecretString>,
    /// Prefix of every key and channel SandBase uses, so several deployments can share one Redis.
    pub key_prefix: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// HMAC-SHA256 secret that signs dashboard session tokens; at least 32 bytes.
    #[serde(serialize_with = "serialize_optional_secret")]
    pub jwt_secret: Option<SecretString>,
    /// Lifetime of a dashboard session token.
    pub session_ttl_secs: u64,
    /// Most API keys kept in each gateway's in-process cache.
    pub key_cache_capacity: usize,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    /// Sustained requests per second per API key (or per session), unless the team overrides it.
    pub per_second: u32,
    /// Requests that may arrive at once above the sustained rate.
    pub burst: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// OTLP/HTTP endpoint (e.g. `http://collector:4318`); traces are off when unset.
    pub otlp_endpoint: Option<String>,
    pub service_name: String,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// `tracing` filter directive, e.g. `info,sandbase_gateway=debug`; `RUST_LOG` wins when set.
    pub log_level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// A configuration problem, naming the key at fault.
#[derive(Debug, thiserror::Error)]
#[error("configuration error: {0}")]
pub struct ConfigError(String);

impl Default for Settings {
    fn default() -> Self {
        Settings {
            server: ServerSettings {
                listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
                body_limit_bytes: 1024 * 1024,
                trust_forwarded_for: false,
                shutdown_grace_secs: 30,
            },
            database: DatabaseSettings {
                url: None,
                max_connections: 20,
                migrate_on_start: true,
            },
            redis: RedisSettings {
                url: None,
                key_prefix: "sandbase:".to_owned(),
            },
            auth: AuthSettings {
                jwt_secret: None,
                session_ttl_secs: 3600,
                key_cache_capacity: 100_000,
            },
            rate_limit: RateLimitSettings {
                per_second: 50,
                burst: 100,
            },
            telemetry: TelemetrySettings {
                otlp_endpoint: None,
                service_name: "sandbase".to_owned(),
                log_format: LogFormat::Text,
                log_level: "info".to_owned(),
            },
            sandboxes: SandboxSettings {
                default_template: "base".to_owned(),
                default_timeout_secs: 300,
                max_timeout_secs: 24 * 3600,
                default_resources: ResourceSettings {
                    cpu_millis: 1000,
                    memory_mb: 512,
                    disk_mb: 1024,
                    pids: 256,
                },
                max_resources: ResourceSettings {
                    cpu_millis: 4000,
                    memory_mb: 8192,
                    disk_mb: 16384,
                    pids: 4096,
                },
                upload_limit_bytes: 1024 * 1024 * 1024,
            },
            workers: WorkerSettings {
                node_token: None,
                heartbeat_ttl_secs: 10,
                lost_after_secs: 30,
            },
            runs: RunSettings {
                artifacts_dir: "/var/lib/sandbase/artifacts".into(),
                input_limit_bytes: 64 * 1024 * 1024,
                max_concurrent: 32,
                s3: None,
            },
            billing: BillingSettings {
                starter_credits: "10".to_owned(),
                starter_expiry_days: 30,
                vcpu_second_micro: 14,
                gib_second_micro: 5,
                cpu_second_micro: 5,
                charge_every_secs: 15,
                grace_secs: 30,
                prices: vec![
                    Price {
                        kind: "model_input_tokens".to_owned(),
                        subject: "*".to_owned(),
                        micro: 3,
                        per: 1,
                    },
                    Price {
                        kind: "model_output_tokens".to_owned(),
                        subject: "*".to_owned(),
                        micro: 15,
                        per: 1,
                    },
                    Price {
                        kind: "api_calls".to_owned(),
                        subject: "*".to_owned(),
                        micro: 1000,
                        per: 1,
                    },
                    Price {
                        kind: "egress_bytes".to_owned(),
                        subject: "*".to_owned(),
                        micro: 50_000,
                        per: 1 << 30,
                    },
                ],
            },
            stripe: StripeSettings {
                secret_key: None,
                webhook_secret: None,
                api_base: "https://api.stripe.com".to_owned(),
                unit_amount: 100,
                currency: "usd".to_owned(),
                min_credits: 5,
                max_credits: 100_000,
                success_url: "http://127.0.0.1:8080/billing/success".to_owned(),
                cancel_url: "http://127.0.0.1:8080/billing/cancel".to_owned(),
                tolerance_secs: 300,
            },
            vault: VaultSettings::default(),
        }
    }
}

impl Settings {
    /// Loads defaults, then `file` (if given), then the environment, and validates the result.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        Self::load_with_defaults(Settings::default(), file)
    }

    /// Like [`Settings::load`], with other defaults (the all-in-one `dev` mode uses local ones).
    pub fn load_with_defaults(
        defaults: Settings,
        file: Option<&Path>,
    ) -> Result<Settings, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(defaults));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file(path));
        }
        let figment = figment
            .merge(
                Env::raw()
                    .only(&["DATABASE_URL"])
                    .map(|_| "database.url".into()),
            )
            .merge(Env::raw().only(&["REDIS_URL"]).map(|_| "redis.url".into()))
            // Settings all live in sections, so only `SANDBASE_<SECTION>__<KEY>` variables
            // are settings; others with the prefix (SANDBASE_URL, SANDBASE_API_KEY of the
            // CLI, test variables) are not.
            .merge(
                Env::prefixed("SANDBASE_")
                    .filter(|key| key.as_str().contains("__"))
                    .split("__"),
            );
        let settings: Settings = figment.extract().map_err(|error| {
            let key = error.path.join(".");
            let message = error.to_string();
            if key.is_empty() {
                ConfigError(message)
            } else {
                ConfigError(format!("key `{key}`: {message}"))
            }
        })?;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.vault.keyring()?;
        let database_url = self.database_url()?;
        let scheme_ok = ["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| database_url.expose_secret().starts_with(scheme));
        if !scheme_ok {
            return Err(ConfigError(
                "key `database.url` (DATABASE_URL) must be a postgres:// or postgresql:// URL"
                    .to_owned(),
            ));
        }
        sqlx::postgres::PgConnectOptions::from_str(database_url.expose_secret()).map_err(
            |error| {
                ConfigError(format!(
                    "key `database.url` (DATABASE_URL) is not a valid PostgreSQL URL: {error}"
                ))
            },
        )?;
        let redis_url = self.redis_url()?;
        redis::Client::open(redis_url.expose_secret()).map_err(|error| {
            ConfigError(format!(
                "key `redis.url` (REDIS_URL) is not a valid Redis URL: {error}"
            ))
        })?;
        let secret = self.auth.jwt_secret.as_ref().ok_or_else(|| {
            ConfigError(
                "key `auth.jwt_secret` (SANDBASE_AUTH__JWT_SECRET) is missing: set a random secret of at least 32 bytes".to_owned(),
            )
        })?;
        if secret.expose_secret().len() < 32 {
            return Err(ConfigError(
                "key `auth.jwt_secret` (SANDBASE_AUTH__JWT_SECRET) is too short: it needs at least 32 bytes".to_owned(),
            ));
        }
        if self.auth.session_ttl_secs == 0 || self.auth.session_ttl_secs > 7 * 24 * 3600 {
            return Err(ConfigError(
                "key `auth.session_ttl_secs` must be between 1 and 604800".to_owned(),
            ));
        }
        if self.rate_limit.per_second == 0 || self.rate_limit.burst == 0 {
            return Err(ConfigError(
                "keys `rate_limit.per_second` and `rate_limit.burst` must be at least 1".to_owned(),
            ));
        }
        if self.server.body_limit_bytes < 1024 {
            return Err(ConfigError(
                "key `server.body_limit_bytes` must be at least 1024".to_owned(),
            ));
        }
        if self.database.max_connections == 0 {
            return Err(ConfigError(
                "key `database.max_connections` must be at least 1".to_owned(),
            ));
        }
        let (default, max) = (
            self.sandboxes.default_resources,
            self.sandboxes.max_resources,
        );
        if default.cpu_millis == 0
            || default.memory_mb < 16
            || default.disk_mb < 16
            || default.pids < 8
            || default.cpu_millis > max.cpu_millis
            || default.memory_mb > max.memory_mb
            || default.disk_mb > max.disk_mb
            || default.pids > max.pids
        {
            return Err(ConfigError(
                "keys `sandboxes.default_resources`: each at least 1 cpu milli, 16 MB memory, 16 MB disk, 8 pids, and at most `sandboxes.max_resources`".to_owned(),
            ));
        }
        if self.sandboxes.default_timeout_secs == 0
            || self.sandboxes.default_timeout_secs > self.sandboxes.max_timeout_secs
        {
            return Err(ConfigError(
                "key `sandboxes.default_timeout_secs` must be between 1 and `sandboxes.max_timeout_secs`".to_owned(),
            ));
        }
        if let Some(token) = &self.workers.node_token
            && token.expose_secret().len() < 16
        {
            return Err(ConfigError(
                "key `workers.node_token` (SANDBASE_WORKERS__NODE_TOKEN) needs at least 16 characters".to_owned(),
            ));
        }
        if self.workers.heartbeat_ttl_secs == 0
            || self.workers.lost_after_secs < self.workers.heartbeat_ttl_secs
        {
            return Err(ConfigError(
                "keys `workers.heartbeat_ttl_secs` (at least 1) and `workers.lost_after_secs` (at least the TTL)".to_owned(),
            ));
        }
        if sandbase_billing::Credits::parse(&self.billing.starter_credits)
            .is_none_or(|credits| credits.0 < 0)
        {
            return Err(ConfigError(
                "key `billing.starter_credits` must be a non-negative amount of credits with at most 6 decimals".to_owned(),
            ));
        }
        for price in &self.billing.prices {
            if !EVENT_KINDS.contains(&price.kind.as_str()) || price.per == 0 {
                return Err(ConfigError(format!(
                    "key `billing.prices`: kind `{}` is not one of {} or `per` is 0",
                    price.kind,
                    EVENT_KINDS.join(", ")
                )));
            }
        }
        if self.runs.max_concurrent == 0 || self.runs.input_limit_bytes < 1024 {
            return Err(ConfigError(
                "keys `runs.max_concurrent` (at least 1) and `runs.input_limit_bytes` (at least 1024)".to_owned(),
            ));
        }
        if let Some(endpoint) = &self.telemetry.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(ConfigError(
                "key `telemetry.otlp_endpoint` must be an http:// or https:// URL".to_owned(),
            ));
        }
        Ok(())
    }

    /// The PostgreSQL URL, or an error naming the key when it is missing.
    pub fn database_url(&self) -> Result<&SecretString, ConfigError> {
        self.database.url.as_ref().ok_or_else(|| {
            ConfigError(
                "key `database.url` is missing: set DATABASE_URL (or SANDBASE_DATABASE__URL)"
                    .to_owned(),
            )
        })
    }

    /// The Redis URL, or an error naming the key when it is missing.
    pub fn redis_url(&self) -> Result<&SecretString, ConfigError> {
        self.redis.url.as_ref().ok_or_else(|| {
            ConfigError(
                "key `redis.url` is missing: set REDIS_URL (or SANDBASE_REDIS__URL)".to_owned(),
            )
        })
    }
}

/// Secrets are written out only so figment can layer the defaults; they are never logged.
fn serialize_secrets<S: serde::Serializer>(
    values: &[SecretString],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(values.iter().map(|secret| secret.expose_secret()))
}

fn serialize_optional_secret<S: serde::Serializer>(
    value: &Option<SecretString>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(secret) => serializer.serialize_some(secret.expose_secret()),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sandbase.example.toml` documents every key with its real default.
    #[test]
    fn the_example_file_matches_the_defaults() {
        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../sandbase.example.toml");
        let from_file: Settings = Figment::from(Toml::file(example))
            .merge(Serialized::defaults(Settings::default()))
            .extract()
            .expect("the example file parses");
        let strict: Settings = Figment::from(Serialized::defaults(Settings::default()))
            .merge(Toml::file(example))
            .extract()
            .expect("the example file has only known keys");
        let defaults = serde_json::to_value(Settings::default()).expect("serializable");
        assert_eq!(
            serde_json::to_value(from_file).expect("serializable"),
            defaults
        );
        assert_eq!(
            serde_json::to_value(strict).expect("serializable"),
            defaults
        );
    }

    #[test]
    fn a_bad_value_names_its_key() {
        let file =
            std::env::temp_dir().join(format!("sandbase-config-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&file, "[server]\nlisten = \"not an address\"\n").expect("write");
        let error = Settings::load(Some(&file))
            .expect_err("invalid")
            .to_string();
        std::fs::remove_file(&file).ok();
        assert!(error.contains("server.listen"), "{error}");

        let file =
            std::env::temp_dir().join(format!("sandbase-config-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(
            &file,
            "[database]\nurl = \"postgres://localhost/x\"\n[redis]\nurl = \"redis://localhost\"\n[auth]\njwt_secret = \"short\"\n",
        )
        .expect("write");
        let error = Settings::load(Some(&file))
            .expect_err("invalid")
            .to_string();
        std::fs::remove_file(&file).ok();
        assert!(error.contains("auth.jwt_secret"), "{error}");
    }
}
