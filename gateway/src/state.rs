//! Shared state of the HTTP handlers.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;

use crate::auth::api_key::{Invalidator, KeyCache, LastUsed};
use crate::auth::session::SessionKeys;
use crate::config::Settings;
use crate::ratelimit::RateLimiter;
use crate::sandboxes::Routes;
use crate::workers::Workers;

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

pub struct Services {
    /// The vault's key-encryption keys (`None`: not configured; secrets answer 501).
    pub vault: Option<Arc<sandbase_vault::Keyring>>,
    pub db: PgPool,
    pub redis: redis::aio::ConnectionManager,
    pub settings: Arc<Settings>,
    pub keys: Arc<KeyCache>,
    pub invalidator: Invalidator,
    pub last_used: Arc<LastUsed>,
    pub sessions: Arc<SessionKeys>,
    pub rate_limiter: RateLimiter,
    pub metrics: PrometheusHandle,
    /// Live workers (from Redis) and the HTTP client for their internal API.
    pub workers: Arc<Workers>,
    /// The fair run queue and the artifact store.
    pub run_queue: Arc<crate::runs::RunQueue>,
    pub artifacts: Arc<crate::runs::ArtifactStore>,
    /// Credit reservations in Redis.
    pub admission: Arc<crate::credits::Admission>,
    /// Cached sandbox → worker routes.
    pub routes: Arc<Routes>,
    /// The served OpenAPI document, rendered once at start-up.
    pub openapi: Arc<serde_json::Value>,
}
