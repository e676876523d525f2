//! What every request and job shares. It imports only leaf types (caches, clients, queues,
//! settings), so any module may take an [`AppState`] without making an import cycle.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;

use crate::auth::api_key::LastUsed;
use crate::auth::key_cache::{Invalidator, KeyCache};
use crate::auth::session::SessionKeys;
use crate::config::Settings;
use crate::credits::Admission;
use crate::failed_auth::FailedAuthBook;
use crate::ratelimit::RateLimiter;
use crate::runs::queue::RunQueue;
use crate::runs::store::ArtifactStore;
use crate::sandboxes::route_cache::RouteCache;
use crate::workers::client::WorkerClient;
use crate::workers::registry::Workers;

/// Cloned for every request by axum's extractors and middleware, so it is one `Arc`.
#[derive(Clone)]
pub struct AppState(Arc<Services>);

impl AppState {
    pub fn new(services: Services) -> Self {
        AppState(Arc::new(services))
    }
}

impl std::ops::Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0
    }
}

/// Everything shared, grouped by the part of the gateway that uses it.
pub struct Services {
    pub db: PgPool,
    pub redis: redis::aio::ConnectionManager,
    pub settings: Arc<Settings>,
    /// The vault's key-encryption keys (`None`: not configured; secrets answer 501).
    pub vault: Option<Arc<sandbase_vault::Keyring>>,
    pub metrics: PrometheusHandle,
    /// Set when the gateway is shutting down: `/readyz` answers 503 `draining`.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// The served OpenAPI document, rendered once at start-up.
    pub openapi: Arc<serde_json::Value>,
    pub auth: AuthServices,
    pub sandboxes: SandboxServices,
    pub billing: BillingServices,
    /// The models and paid APIs offered through the gateway.
    pub store: Arc<crate::store::Store>,
    pub harness: HarnessServices,
}

/// The harness's signals on this gateway.
pub struct HarnessServices {
    /// This gateway's name in the runs' leases.
    pub instance: String,
    /// Wakes this gateway's dispatcher (a run was made, or became ready to step).
    pub wake: Arc<tokio::sync::Notify>,
    /// The runs that have new events, for the streams following them here.
    pub events: tokio::sync::broadcast::Sender<uuid::Uuid>,
}

impl HarnessServices {
    pub fn new() -> HarnessServices {
        HarnessServices {
            instance: format!("gateway-{}", uuid::Uuid::new_v4().simple()),
            wake: Arc::default(),
            events: tokio::sync::broadcast::channel(4096).0,
        }
    }
}

/// Who is calling, and how often they may: keys, sessions, limits, failed attempts.
pub struct AuthServices {
    pub keys: Arc<KeyCache>,
    pub invalidator: Invalidator,
    pub last_used: Arc<LastUsed>,
    pub sessions: Arc<SessionKeys>,
    pub rate_limiter: RateLimiter,
    /// This gateway's leases of team rate-limit buckets.
    pub team_leases: Arc<crate::ratelimit::TeamLeases>,
    /// Per-address request and failed-authentication limits, in memory.
    pub ip_guard: Arc<crate::ip_guard::IpGuard>,
    /// Argon2 with a bounded number of hashes at once.
    pub passwords: Arc<crate::auth::password::Passwords>,
    /// Failed authentications counted between their audit rows.
    pub failed_auth: Arc<FailedAuthBook>,
    /// Outgoing mail, when e-mail verification is on.
    pub mailer: Option<Arc<crate::mail::Mailer>>,
}

/// Where sandboxes and runs live: the workers, their client, routes, previews, the run queue
/// and the artifact store.
pub struct SandboxServices {
    /// Live workers (from Redis).
    pub workers: Arc<Workers>,
    /// The client of the workers' internal API (and the node token).
    pub worker_client: Arc<WorkerClient>,
    /// TLS of the internal channel, when configured.
    pub channel: Option<sandbase_egress::channel::ChannelTls>,
    /// Cached sandbox → worker routes.
    pub routes: Arc<RouteCache>,
    /// Previews read recently (each request to a preview host needs one).
    pub preview_cache: Arc<crate::sandboxes::preview_cache::PreviewCache>,
    /// Preview relays open on this gateway, within their limits.
    pub preview_budget: Arc<crate::sandboxes::preview_budget::PreviewBudget>,
    /// Each team's kept recording bytes, read at most once a few seconds (the quota check
    /// is on every recorded command's path).
    pub recording_usage: Arc<crate::sandboxes::usage_cache::UsageCache>,
    /// The fair run queue and the artifact store.
    pub run_queue: Arc<RunQueue>,
    pub artifacts: Arc<ArtifactStore>,
}

/// Money: credit reservations and the client of the payment provider.
pub struct BillingServices {
    /// Credit reservations in Redis.
    pub admission: Arc<Admission>,
    /// The client of outside services (Stripe).
    pub http: reqwest::Client,
}
