//! The sections of the configuration, each with its defaults.

use std::net::SocketAddr;

use sandbase_api::sandboxes::Isolation;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

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
    /// Micro-credits per second of one GiB of a paused sandbox's memory (a paused sandbox
    /// pays for nothing else: no vCPU, and it uses no CPU time).
    pub paused_gib_second_micro: u64,
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
pub const EVENT_KINDS: [&str; 5] = [
    "model_input_tokens",
    "model_output_tokens",
    "api_calls",
    "egress_bytes",
    "storage_mb_seconds",
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
    /// How long a run's artifact is kept after the run finished; then it is deleted (and
    /// `GET /v1/runs/{id}/artifacts` answers 410 `artifact_expired`).
    pub artifact_retention_secs: u64,
    /// Kept artifacts are metered as `storage_mb_seconds` usage in periods of this length.
    pub storage_meter_secs: u64,
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
    /// Isolation of sandboxes that name none (`runc` or `gvisor`)...
    #[serde(default)]
    pub default_isolation: Isolation,
    /// ... unless their template's is set here (`{ untrusted = "gvisor" }`).
    #[serde(default)]
    pub template_isolation: std::collections::BTreeMap<String, Isolation>,
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
    /// Sandboxes a team may have at once (creating or running), unless the operator set the
    /// team's own (`sandbase admin sandbox-quota`).
    pub max_per_team: u32,
    /// Snapshots are deleted this long after they were taken (metered as storage meanwhile).
    pub snapshot_retention_secs: u64,
    /// Terminal recordings are deleted this long after their session began.
    pub recording_retention_secs: u64,
    /// MiB of recordings a team may keep at once (metered as storage meanwhile); a command
    /// or session asking to be recorded past it is refused (`recording_quota_reached`).
    /// 0: no quota.
    pub recording_quota_mb: u64,
    /// A sandbox made with an API key stops when the key is revoked or expires (a key given to
    /// an agent or a CI job takes what it started with it).
    pub stop_with_key: bool,
}

/// Preview URLs: a sandbox's ports at `{port}-{sandbox_id}.{domain}`, routed by `Host` on
/// the public listener (point a wildcard DNS name, `*.{domain}`, at the gateway).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreviewSettings {
    /// Unset: previews are off (`POST …/previews` answers 501 `previews_not_configured`).
    pub domain: Option<String>,
    /// The scheme of preview URLs (`https` behind a TLS terminator).
    pub scheme: String,
    /// The port in preview URLs (unset: the scheme's default).
    pub port: Option<u16>,
    /// Preview relays (requests and upgraded connections) open at once on a gateway, in a
    /// budget apart from the API's; beyond it previews answer 503 `preview_busy`.
    pub max_connections: usize,
    /// Of those, at most this many to one sandbox, and to one port of it.
    pub max_connections_per_sandbox: usize,
    pub max_connections_per_preview: usize,
    /// An upgraded preview connection (a WebSocket) with nothing sent either way for this
    /// long is closed.
    pub idle_timeout_secs: u64,
}

impl Default for PreviewSettings {
    fn default() -> Self {
        PreviewSettings {
            domain: None,
            scheme: "https".to_owned(),
            port: None,
            max_connections: 1024,
            max_connections_per_sandbox: 128,
            max_connections_per_preview: 64,
            idle_timeout_secs: 300,
        }
    }
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
    /// The most sandboxes one worker may register for (a larger claim is refused).
    pub max_capacity: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address the public API listens on.
    pub listen: SocketAddr,
    /// Address of the internal plane: worker registration, heartbeats and usage reports,
    /// template operations and `/metrics`. Keep it private (loopback, or a network only
    /// workers and the operator reach); these routes answer 404 on the public listener.
    pub internal_listen: SocketAddr,
    /// Largest accepted request body, in bytes.
    pub body_limit_bytes: usize,
    /// Proxies (addresses or blocks) whose `X-Forwarded-For` is believed: the client is
    /// the rightmost address in it that is not one of them.
    pub trusted_proxies: Vec<super::Cidr>,
    /// How long in-flight requests may take to finish after SIGTERM.
    pub shutdown_grace_secs: u64,
    /// After SIGTERM, how long the gateway keeps serving while `/readyz` answers 503
    /// `draining`, so load balancers stop sending before it stops accepting.
    pub drain_secs: u64,
    /// How long a client may take to send a request's headers (slow clients are cut off).
    pub header_read_timeout_secs: u64,
    /// Most connections open at once; further ones wait to be accepted.
    pub max_connections: usize,
    /// Most connections open at once from one address (0: no limit); further ones are closed.
    pub max_connections_per_ip: usize,
    /// Requests per second one address may make, before anything else (0: no limit).
    pub requests_per_ip_per_second: u32,
    /// Requests one address may make at once above that rate.
    pub requests_per_ip_burst: u32,
    /// The URL clients reach the gateway at (`https://sandbase.example.com`). `/mcp` then
    /// accepts requests for its host only, and browser `Origin`s of it only; unset, any host
    /// (every MCP request is authenticated by its key) and no browser `Origin` at all.
    #[serde(default)]
    pub public_url: Option<String>,
    /// The built dashboard (`web/dist`), served at `/` with its assets; unset, no dashboard.
    #[serde(default)]
    pub web_dir: Option<std::path::PathBuf>,
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
    /// How long a cached key is trusted before it is read again: the longest a revocation
    /// can go unseen should the invalidation subscription die unnoticed.
    pub key_cache_ttl_secs: u64,
    /// How often the invalidation subscription is pinged; unanswered within as long, the
    /// cache is bypassed until a new subscription is up.
    pub key_cache_ping_secs: u64,
    /// Sign-ups from one address an hour (IPv6: one /64; an IPv4 /24 gets three times as many).
    pub signups_per_hour: u32,
    /// Logins from one address a minute (IPv6: one /64; an IPv4 /24 gets three times as many).
    pub logins_per_minute: u32,
    /// Failed authentications of one address and credential are audited once at once, then as
    /// one row with their count per this many seconds.
    pub failed_auth_window_secs: u64,
    /// The operator's token: `/v1/admin/*` and template operations (`Authorization: Bearer`).
    /// Unset, those routes refuse everybody. Must differ from `workers.node_token`.
    #[serde(serialize_with = "serialize_optional_secret")]
    pub operator_token: Option<SecretString>,
    /// Failed authentications one address may make a minute; past it, its credentials are not
    /// even looked at (429) until the minute has passed (0: no limit).
    pub failed_auth_per_minute: u32,
    /// Passwords hashed or verified at once (0: one per core); a login waiting longer than
    /// a second for a slot is answered 503 `busy`.
    pub password_slots: usize,
    /// New accounts prove their e-mail address (a code mailed through `[smtp]`) before they
    /// get starter credits and an API key; sign-up then answers the same for a new and a
    /// registered address.
    pub verify_email: bool,
    /// The link in a verification mail; `{token}` is replaced by the code.
    pub verify_url: String,
    /// How long a verification code is valid.
    pub verify_ttl_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpSettings {
    pub host: String,
    pub port: u16,
    /// `starttls` (upgrade a plain connection, port 587), `tls` (port 465) or `none` (a
    /// relay on this machine only).
    pub security: SmtpSecurity,
    pub username: Option<String>,
    #[serde(serialize_with = "serialize_optional_secret")]
    pub password: Option<SecretString>,
    /// The sender, e.g. `SandBase <no-reply@example.com>`.
    pub from: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    StartTls,
    Tls,
    None,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    /// Sustained requests per second per API key (or per session), unless the team overrides it.
    pub per_second: u32,
    /// Requests that may arrive at once above the sustained rate.
    pub burst: u32,
    /// Sustained requests per second of a whole team, whatever its number of keys and
    /// sessions (at least its per-key rate), so minting keys does not multiply a team's rate.
    pub team_per_second: u32,
    /// Requests a whole team may make at once above its sustained rate (at least its
    /// per-key burst).
    pub team_burst: u32,
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
pub struct ConfigError(pub(super) String);

impl Default for SandboxSettings {
    fn default() -> Self {
        SandboxSettings {
            default_template: "base".to_owned(),
            default_isolation: Isolation::Runc,
            template_isolation: Default::default(),
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
            max_per_team: 20,
            snapshot_retention_secs: 7 * 24 * 3600,
            recording_retention_secs: 30 * 24 * 3600,
            recording_quota_mb: 2048,
            stop_with_key: true,
        }
    }
}

impl Default for BillingSettings {
    fn default() -> Self {
        BillingSettings {
            starter_credits: "10".to_owned(),
            starter_expiry_days: 30,
            vcpu_second_micro: 14,
            gib_second_micro: 5,
            paused_gib_second_micro: 5,
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
                // 100 micro-credits per GB-hour of kept artifacts.
                Price {
                    kind: "storage_mb_seconds".to_owned(),
                    subject: "*".to_owned(),
                    micro: 100,
                    per: 1024 * 3600,
                },
            ],
        }
    }
}

impl Default for StripeSettings {
    fn default() -> Self {
        StripeSettings {
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
        }
    }
}

/// Secrets are written out only so figment can layer the defaults; they are never logged.
pub(super) fn serialize_secrets<S: serde::Serializer>(
    values: &[SecretString],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(values.iter().map(|secret| secret.expose_secret()))
}

pub(super) fn serialize_optional_secret<S: serde::Serializer>(
    value: &Option<SecretString>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(secret) => serializer.serialize_some(secret.expose_secret()),
        None => serializer.serialize_none(),
    }
}

/// The harness (agent runs): how gateways share the runs they step.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HarnessSettings {
    /// Seconds a gateway's lease of a run lasts unless renewed (renewed every third of it);
    /// a run whose lease ran out is adopted by any gateway.
    pub lease_secs: u64,
    /// Most runs one gateway steps at once.
    pub max_concurrent: usize,
    /// Networks a URL a team names (a remote MCP server) may not reach, besides what the
    /// egress guard always refuses (loopback, private, link-local, metadata, …) and the
    /// gateway's own listeners: the fleet's public addresses, say.
    pub denied_networks: Vec<sandbase_egress::ssrf::Cidr>,
}

impl Default for HarnessSettings {
    fn default() -> Self {
        HarnessSettings {
            lease_secs: 15,
            max_concurrent: 256,
            denied_networks: Vec::new(),
        }
    }
}
