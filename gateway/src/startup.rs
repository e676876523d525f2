//! Building and running the gateway: `Application::build` connects, migrates and binds
//! (port 0 works, for tests); `run_until_stopped` serves until the shutdown future fires.

use std::future::Future;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::auth::api_key::LastUsed;
use crate::auth::key_cache::{self, Invalidator, KeyCache};
use crate::auth::session::SessionKeys;
use crate::config::Settings;
use crate::credits::Admission;
use crate::http::Routes;
use crate::ratelimit::RateLimiter;
use crate::runs::{ArtifactStore, RunQueue};
use crate::sandboxes::route_cache::RouteCache;
use crate::state::{AppState, AuthServices, BillingServices, SandboxServices, Services};
use crate::workers::{WorkerClient, Workers};

pub struct Application {
    listener: TcpListener,
    local_addr: SocketAddr,
    router: Router,
    internal_listener: TcpListener,
    internal_addr: SocketAddr,
    internal_router: Router,
    state: AppState,
    background: Vec<JoinHandle<()>>,
}

/// The Redis channel API-key invalidations travel on.
pub fn invalidation_channel(key_prefix: &str) -> String {
    format!("{key_prefix}keys:invalidate")
}

/// Connects to Postgres (without migrating).
pub async fn connect_database(settings: &Settings) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(settings.database_url()?.expose_secret())
        .context("parsing database.url")?;
    PgPoolOptions::new()
        .max_connections(settings.database.max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .context("connecting to PostgreSQL (database.url)")
}

/// Applies the migrations embedded in this binary.
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    sqlx::migrate!("../migrations")
        .run(db)
        .await
        .context("applying database migrations")
}

/// Connects to Redis with bounded connect and response times.
pub async fn connect_redis(settings: &Settings) -> anyhow::Result<redis::aio::ConnectionManager> {
    let client =
        redis::Client::open(settings.redis_url()?.expose_secret()).context("parsing redis.url")?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .context("connecting to Redis (redis.url)")
}

/// Binds a listener (port 0 works) and reads back its address.
async fn bind(address: SocketAddr, key: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("binding {key} ({address})"))?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("reading the address bound for {key}"))?;
    Ok((listener, bound))
}

/// Where sandboxes and runs live: the workers, their client, routes, previews, the run queue
/// and the artifact store.
fn sandbox_services(
    settings: &Settings,
    redis: &redis::aio::ConnectionManager,
) -> anyhow::Result<SandboxServices> {
    let (worker_client, channel) = worker_client(settings)?;
    Ok(SandboxServices {
        workers: Arc::new(Workers::new(settings, redis.clone())),
        worker_client,
        channel,
        routes: Arc::new(RouteCache::default()),
        preview_cache: Arc::default(),
        recording_usage: Arc::default(),
        preview_budget: Arc::new(crate::sandboxes::preview_budget::PreviewBudget::new(
            &settings.previews,
        )),
        run_queue: Arc::new(RunQueue::new(redis.clone(), &settings.redis.key_prefix)),
        artifacts: Arc::new(ArtifactStore::from_settings(&settings.runs)?),
    })
}

/// Credit reservations and the client of the payment provider.
fn billing_services(
    settings: &Settings,
    redis: &redis::aio::ConnectionManager,
) -> anyhow::Result<BillingServices> {
    Ok(BillingServices {
        admission: Arc::new(Admission::new(redis.clone(), &settings.redis.key_prefix)),
        http: reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .context("building the HTTP client")?,
    })
}

/// The internal channel's TLS (when configured) and the client of the workers that uses it.
fn worker_client(
    settings: &Settings,
) -> anyhow::Result<(
    Arc<WorkerClient>,
    Option<sandbase_egress::channel::ChannelTls>,
)> {
    let tls = match &settings.internal_tls {
        Some(files) => Some(
            files
                .load()
                .map_err(|error| anyhow::anyhow!("internal_tls: {error}"))?,
        ),
        None => None,
    };
    let client = WorkerClient::new(
        settings.workers.node_token.clone(),
        tls.as_ref().map(|tls| tls.client.as_ref()),
    )?;
    Ok((Arc::new(client), tls))
}

/// The periodic jobs, the key-invalidation listener and the run dispatcher.
fn spawn_background(
    state: &AppState,
    redis_client: redis::Client,
    channel: String,
    keys: Arc<KeyCache>,
) -> Vec<JoinHandle<()>> {
    let mut background = crate::jobs::spawn_all(state);
    background.push(tokio::spawn(
        key_cache::run_invalidation_listener(
            redis_client,
            channel,
            keys,
            Duration::from_secs(state.settings.auth.key_cache_ping_secs),
        )
        .instrument(tracing::info_span!("key_invalidation")),
    ));
    background.push(tokio::spawn(
        crate::runs::dispatch::dispatch_forever(
            state.clone(),
            Arc::new(tokio::sync::Semaphore::new(
                state.settings.runs.max_concurrent,
            )),
        )
        .instrument(tracing::info_span!("run_dispatcher")),
    ));
    background
}

/// The vault's keyring, and the store with its upstreams' credentials (operator secrets
/// revealed from that vault).
async fn vault_and_store(
    settings: &Settings,
    db: &PgPool,
) -> anyhow::Result<(
    Option<Arc<sandbase_vault::Keyring>>,
    Arc<crate::store::Store>,
)> {
    let vault = settings
        .vault
        .keyring()
        .map_err(|error| anyhow::anyhow!("{error}"))?
        .map(Arc::new);
    let secrets = crate::store::operator_secrets(&settings.store, db, vault.as_deref()).await?;
    let store = Arc::new(crate::store::Store::new(&settings.store, &secrets)?);
    Ok((vault, store))
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        let db = connect_database(&settings).await?;
        if settings.database.migrate_on_start {
            migrate(&db).await?;
        }
        let redis = connect_redis(&settings).await?;
        let redis_client = redis::Client::open(settings.redis_url()?.expose_secret())
            .context("parsing redis.url")?;

        let keys = Arc::new(KeyCache::new(
            settings.auth.key_cache_capacity,
            Duration::from_secs(settings.auth.key_cache_ttl_secs),
        ));
        let channel = invalidation_channel(&settings.redis.key_prefix);
        let invalidator = Invalidator::new(redis.clone(), channel.clone(), keys.clone());
        let jwt_secret = settings
            .auth
            .jwt_secret
            .clone()
            .context("auth.jwt_secret is missing")?;
        let sessions = Arc::new(SessionKeys::new(
            jwt_secret,
            settings.auth.session_ttl_secs,
        )?);
        let last_used = Arc::new(LastUsed::default());

        let routes = Routes::new(&settings)?;
        let openapi = Arc::new(routes.openapi.clone());
        let (vault, store) = vault_and_store(&settings, &db).await?;
        let auth = AuthServices {
            keys: keys.clone(),
            invalidator,
            last_used,
            sessions,
            rate_limiter: RateLimiter::new(&settings.redis.key_prefix),
            team_leases: Arc::default(),
            ip_guard: Arc::new(crate::ip_guard::IpGuard::new(
                settings.server.requests_per_ip_per_second,
                settings.server.requests_per_ip_burst,
                settings.auth.failed_auth_per_minute,
            )),
            passwords: Arc::new(crate::auth::password::Passwords::new(
                settings.auth.password_slots,
                Duration::from_secs(1),
            )),
            failed_auth: Arc::new(crate::failed_auth::FailedAuthBook::new(
                Duration::from_secs(settings.auth.failed_auth_window_secs),
            )),
            mailer: match settings.auth.verify_email {
                true => Some(Arc::new(crate::mail::Mailer::new(&settings.smtp)?)),
                false => None,
            },
        };
        let sandboxes = sandbox_services(&settings, &redis)?;
        let billing = billing_services(&settings, &redis)?;
        let state = AppState::new(Services {
            db: db.clone(),
            vault,
            metrics: crate::http::metrics::prometheus_handle(),
            draining: Arc::default(),
            openapi,
            auth,
            sandboxes,
            billing,
            store,
            harness: crate::state::HarnessServices::new(),
            redis,
            settings: Arc::new(settings),
        });
        let (router, harness_api) = routes.into_router(state.clone());
        let internal_router = crate::http::internal_router(state.clone());

        let mut background = spawn_background(&state, redis_client, channel, keys);
        background.push(tokio::spawn(
            crate::harness::dispatch::dispatch_forever(state.clone(), harness_api)
                .instrument(tracing::info_span!("harness_dispatcher")),
        ));

        let (listener, local_addr) = bind(state.settings.server.listen, "server.listen").await?;
        let (internal_listener, internal_addr) = bind(
            state.settings.server.internal_listen,
            "server.internal_listen",
        )
        .await?;
        Ok(Application {
            listener,
            local_addr,
            router,
            internal_listener,
            internal_addr,
            internal_router,
            state,
            background,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The internal listener's address (workers and the operator's tools).
    pub fn internal_addr(&self) -> SocketAddr {
        self.internal_addr
    }

    pub(crate) fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` completes, then lets in-flight requests finish for at most
    /// `server.shutdown_grace_secs`, and writes what is still buffered.
    pub async fn run_until_stopped<F>(self, shutdown: F) -> anyhow::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Application {
            listener,
            router,
            internal_listener,
            internal_router,
            state,
            background,
            ..
        } = self;
        let (stop_sender, stop_receiver) = tokio::sync::watch::channel(false);
        let grace = Duration::from_secs(state.settings.server.shutdown_grace_secs);
        let limits = crate::http::serve::Limits::from_settings(&state.settings.server);
        let internal = tokio::spawn(crate::http::serve::serve(
            internal_listener,
            internal_router,
            limits.clone(),
            state
                .sandboxes
                .channel
                .as_ref()
                .map(|tls| Arc::clone(&tls.server)),
            stop_receiver.clone(),
            grace,
        ));
        let mut server = tokio::spawn(crate::http::serve::serve(
            listener,
            router,
            limits,
            None,
            stop_receiver,
            grace,
        ));
        tokio::select! {
            result = &mut server => {
                result.context("serving HTTP")?;
            }
            () = shutdown => {
                // Readiness flips first; load balancers stop sending while the gateway still
                // serves what reaches it; then it stops accepting and finishes in flight.
                let drain = Duration::from_secs(state.settings.server.drain_secs);
                state.draining.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::info!(seconds = drain.as_secs(), "shutting down: draining (/readyz answers 503)");
                tokio::time::sleep(drain).await;
                tracing::info!("shutting down: finishing in-flight requests");
                let _ = stop_sender.send(true);
                server.await.context("serving HTTP")?;
            }
        }
        let _ = stop_sender.send(true);
        internal.await.context("serving the internal plane")?;
        for task in background {
            task.abort();
        }
        if let Err(error) = state.auth.last_used.flush(&state.db).await {
            tracing::warn!(error = %error, "writing API key last-used times at shutdown failed");
        }
        state.db.close().await;
        Ok(())
    }
}
