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

mod cidr;
mod sections;
mod store;

pub use cidr::Cidr;
pub use store::{
    ApiSettings, CredentialSource, Injection, McpServerSettings, ModelSettings, ProviderKind,
    ProviderSettings, StoreSettings, TokenPrices,
};

pub use sections::{
    AuthSettings, BillingSettings, ConfigError, DatabaseSettings, EVENT_KINDS, HarnessSettings,
    LogFormat, PreviewSettings, Price, RateLimitSettings, RedisSettings, ResourceSettings,
    RunSettings, S3Settings, SandboxSettings, ServerSettings, SmtpSecurity, SmtpSettings,
    StripeSettings, TelemetrySettings, VaultSettings, WorkerSettings,
};

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
    /// Outgoing mail (verification codes), used when `auth.verify_email` is on.
    pub smtp: SmtpSettings,
    /// Preview URLs of sandboxes' ports.
    #[serde(default)]
    pub previews: PreviewSettings,
    /// The harness: agent runs.
    #[serde(default)]
    pub harness: HarnessSettings,
    /// The models and paid APIs offered through the gateway.
    #[serde(default)]
    pub store: StoreSettings,
    /// TLS on the internal channel (the internal listener, and calls to workers): the
    /// operator's CA, and the gateway's certificate and key. Without it, workers are reached
    /// over plain HTTP and sandboxes with credentials are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_tls: Option<sandbase_egress::channel::ChannelFiles>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            server: ServerSettings {
                listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
                internal_listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
                body_limit_bytes: 1024 * 1024,
                trusted_proxies: Vec::new(),
                shutdown_grace_secs: 30,
                drain_secs: 5,
                header_read_timeout_secs: 10,
                max_connections: 10_000,
                max_connections_per_ip: 256,
                requests_per_ip_per_second: 200,
                requests_per_ip_burst: 400,
                public_url: None,
                web_dir: None,
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
                key_cache_ttl_secs: 60,
                key_cache_ping_secs: 5,
                signups_per_hour: 10,
                logins_per_minute: 30,
                failed_auth_window_secs: 60,
                operator_token: None,
                failed_auth_per_minute: 60,
                password_slots: 0,
                verify_email: false,
                verify_url: "http://127.0.0.1:8080/verify?token={token}".to_owned(),
                verify_ttl_secs: 24 * 3600,
            },
            rate_limit: RateLimitSettings {
                per_second: 50,
                burst: 100,
                team_per_second: 200,
                team_burst: 400,
            },
            telemetry: TelemetrySettings {
                otlp_endpoint: None,
                service_name: "sandbase".to_owned(),
                log_format: LogFormat::Text,
                log_level: "info".to_owned(),
            },
            workers: WorkerSettings {
                node_token: None,
                heartbeat_ttl_secs: 10,
                lost_after_secs: 30,
                max_capacity: 1000,
            },
            runs: RunSettings {
                artifacts_dir: "/var/lib/sandbase/artifacts".into(),
                input_limit_bytes: 64 * 1024 * 1024,
                max_concurrent: 32,
                artifact_retention_secs: 7 * 24 * 3600,
                storage_meter_secs: 3600,
                s3: None,
            },
            sandboxes: SandboxSettings::default(),
            billing: BillingSettings::default(),
            stripe: StripeSettings::default(),
            vault: VaultSettings::default(),
            smtp: SmtpSettings {
                host: "127.0.0.1".to_owned(),
                port: 587,
                security: SmtpSecurity::StartTls,
                username: None,
                password: None,
                from: "SandBase <no-reply@localhost>".to_owned(),
            },
            previews: PreviewSettings::default(),
            harness: HarnessSettings::default(),
            store: StoreSettings::default(),
            internal_tls: None,
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
        self.validate_connections()?;
        self.validate_previews()?;
        self.store.validate()?;
        self.validate_limits()
    }

    /// A preview domain is a lowercase DNS name; the scheme is http or https.
    fn validate_previews(&self) -> Result<(), ConfigError> {
        let previews = &self.previews;
        if let Some(domain) = &previews.domain {
            let valid = !domain.is_empty()
                && domain.len() <= 200
                && domain.split('.').all(|label| {
                    !label.is_empty()
                        && !label.starts_with('-')
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                });
            if !valid {
                return Err(ConfigError(format!(
                    "key `previews.domain` must be a lowercase DNS name such as previews.example.com, not `{domain}`"
                )));
            }
        }
        if !matches!(previews.scheme.as_str(), "http" | "https") {
            return Err(ConfigError(
                "key `previews.scheme` must be `http` or `https`".to_owned(),
            ));
        }
        Ok(())
    }

    /// The vault's keys, the database and Redis URLs, the session secret.
    fn validate_connections(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// Sessions, and the limits on what anyone may try before authenticating.
    fn validate_auth(&self) -> Result<(), ConfigError> {
        if self.auth.session_ttl_secs == 0 || self.auth.session_ttl_secs > 7 * 24 * 3600 {
            return Err(ConfigError(
                "key `auth.session_ttl_secs` must be between 1 and 604800".to_owned(),
            ));
        }
        if self.auth.failed_auth_window_secs == 0 || self.auth.failed_auth_window_secs > 3600 {
            return Err(ConfigError(
                "key `auth.failed_auth_window_secs` must be between 1 and 3600".to_owned(),
            ));
        }
        if self.auth.signups_per_hour == 0 || self.auth.logins_per_minute == 0 {
            return Err(ConfigError(
                "keys `auth.signups_per_hour` and `auth.logins_per_minute` must be at least 1"
                    .to_owned(),
            ));
        }
        if self.auth.verify_email
            && (!self.auth.verify_url.contains("{token}") || self.auth.verify_ttl_secs == 0)
        {
            return Err(ConfigError(
                "key `auth.verify_url` must contain `{token}` and `auth.verify_ttl_secs` be at least 1 when `auth.verify_email` is on".to_owned(),
            ));
        }
        if !(1..=3600).contains(&self.auth.key_cache_ttl_secs)
            || !(1..=60).contains(&self.auth.key_cache_ping_secs)
        {
            return Err(ConfigError(
                "key `auth.key_cache_ttl_secs` must be between 1 and 3600, and \
                 `auth.key_cache_ping_secs` between 1 and 60"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// The node and operator tokens: long enough, and not one another.
    fn validate_tokens(&self) -> Result<(), ConfigError> {
        if let Some(token) = &self.workers.node_token
            && token.expose_secret().len() < 16
        {
            return Err(ConfigError(
                "key `workers.node_token` (SANDBASE_WORKERS__NODE_TOKEN) needs at least 16 characters".to_owned(),
            ));
        }
        if let Some(operator) = &self.auth.operator_token {
            let operator = operator.expose_secret();
            if operator.len() < 16 {
                return Err(ConfigError(
                    "key `auth.operator_token` (SANDBASE_AUTH__OPERATOR_TOKEN) needs at least 16 characters".to_owned(),
                ));
            }
            if self
                .workers
                .node_token
                .as_ref()
                .is_some_and(|node| node.expose_secret() == operator)
            {
                return Err(ConfigError(
                    "key `auth.operator_token` must differ from `workers.node_token`: a worker's token must not be the operator's".to_owned(),
                ));
            }
        }
        Ok(())
    }

    /// The listener's limits.
    fn validate_server(&self) -> Result<(), ConfigError> {
        let server = &self.server;
        if server.body_limit_bytes < 1024 {
            return Err(ConfigError(
                "key `server.body_limit_bytes` must be at least 1024".to_owned(),
            ));
        }
        if !(1..=300).contains(&server.header_read_timeout_secs) {
            return Err(ConfigError(
                "key `server.header_read_timeout_secs` must be between 1 and 300".to_owned(),
            ));
        }
        if server.max_connections == 0 {
            return Err(ConfigError(
                "key `server.max_connections` must be at least 1".to_owned(),
            ));
        }
        if server.requests_per_ip_per_second > 0 && server.requests_per_ip_burst == 0 {
            return Err(ConfigError(
                "key `server.requests_per_ip_burst` must be at least 1 when \
                 `server.requests_per_ip_per_second` is set"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// Sizes, lifetimes, rates and prices.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        self.validate_auth()?;
        if self.sandboxes.max_per_team == 0 {
            return Err(ConfigError(
                "key `sandboxes.max_per_team` must be at least 1".to_owned(),
            ));
        }
        if self.rate_limit.per_second == 0
            || self.rate_limit.burst == 0
            || self.rate_limit.team_per_second == 0
            || self.rate_limit.team_burst == 0
        {
            return Err(ConfigError(
                "keys `rate_limit.per_second`, `rate_limit.burst`, `rate_limit.team_per_second` and `rate_limit.team_burst` must be at least 1".to_owned(),
            ));
        }
        self.validate_server()?;
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
        self.validate_tokens()?;
        if self.runs.artifact_retention_secs == 0 || self.runs.storage_meter_secs == 0 {
            return Err(ConfigError(
                "keys `runs.artifact_retention_secs` and `runs.storage_meter_secs` must be at least 1".to_owned(),
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
