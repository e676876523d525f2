//! Building and running the gateway: `Application::build` connects, migrates and binds
//! (port 0 works, for tests); `run_until_stopped` serves until the shutdown future fires.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::auth::api_key::{self, Invalidator, KeyCache, LastUsed};
use crate::auth::session::SessionKeys;
use crate::config::Settings;
use crate::ratelimit::RateLimiter;
use crate::state::{AppState, Services};
use crate::{audit, observe, request_id, routes};

/// How often batched `last_used_at` updates are written.
const LAST_USED_FLUSH_INTERVAL: Duration = Duration::from_secs(2);

pub struct Application {
    listener: TcpListener,
    local_addr: SocketAddr,
    router: Router,
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

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        let db = connect_database(&settings).await?;
        if settings.database.migrate_on_start {
            migrate(&db).await?;
        }
        let redis = connect_redis(&settings).await?;
        let redis_client = redis::Client::open(settings.redis_url()?.expose_secret())
            .context("parsing redis.url")?;

        let keys = Arc::new(KeyCache::new(settings.auth.key_cache_capacity));
        let channel = invalidation_channel(&settings.redis.key_prefix);
        let invalidator = Invalidator::new(redis.clone(), channel.clone(), keys.clone());
        let jwt_secret = settings
            .auth
            .jwt_secret
            .clone()
            .context("auth.jwt_secret is missing")?;
        let sessions = Arc::new(SessionKeys::new(jwt_secret, settings.auth.session_ttl_secs));
        let last_used = Arc::new(LastUsed::default());

        let (api, operations) = routes::api_router(&settings);
        let (api_router, mut document) = api.split_for_parts();
        let (operations_router, operations_document) = operations.split_for_parts();
        document.merge(operations_document);
        let openapi =
            Arc::new(serde_json::to_value(&document).context("rendering the OpenAPI document")?);

        let settings_for_workers = settings.clone();
        let redis_for_workers = redis.clone();
        let vault = settings
            .vault
            .keyring()
            .map_err(|error| anyhow::anyhow!("{error}"))?
            .map(Arc::new);
        let state = AppState::new(Services {
            vault,
            db: db.clone(),
            redis,
            rate_limiter: RateLimiter::new(&settings.redis.key_prefix),
            settings: Arc::new(settings),
            keys: keys.clone(),
            invalidator,
            last_used: last_used.clone(),
            sessions,
            metrics: observe::prometheus_handle(),
            workers: Arc::new(crate::workers::Workers::new(
                &settings_for_workers,
                redis_for_workers.clone(),
            )?),
            routes: Arc::new(crate::sandboxes::Routes::default()),
            admission: Arc::new(crate::credits::Admission::new(
                redis_for_workers.clone(),
                &settings_for_workers.redis.key_prefix,
            )),
            run_queue: Arc::new(crate::runs::RunQueue::new(
                redis_for_workers.clone(),
                &settings_for_workers.redis.key_prefix,
            )),
            artifacts: Arc::new(crate::runs::ArtifactStore::from_settings(
                &settings_for_workers.runs,
            )?),
            openapi,
        });

        let router = api_router
            .route_layer(from_fn_with_state(state.clone(), audit::middleware))
            .merge(operations_router)
            .merge(crate::workers::internal_router())
            .merge(crate::templates::internal_router())
            .merge(crate::usage::internal_router())
            .route_layer(from_fn(observe::middleware))
            .fallback(routes::fallback)
            .method_not_allowed_fallback(routes::method_not_allowed)
            .with_state(state.clone())
            .layer(DefaultBodyLimit::max(
                state.settings.server.body_limit_bytes,
            ))
            .layer(from_fn(request_id::middleware));

        let mut background = Vec::new();
        background.push(tokio::spawn(
            api_key::run_invalidation_listener(redis_client, channel, keys)
                .instrument(tracing::info_span!("key_invalidation")),
        ));
        background.push(tokio::spawn(async move {
            let mut interval = tokio::time::interval(LAST_USED_FLUSH_INTERVAL);
            loop {
                interval.tick().await;
                if let Err(error) = last_used.flush(&db).await {
                    tracing::warn!(error = %error, "writing API key last-used times failed");
                }
            }
        }));

        let reaper_state = state.clone();
        background.push(tokio::spawn(
            async move {
                let mut interval = tokio::time::interval(crate::sandboxes::REAPER_INTERVAL);
                loop {
                    interval.tick().await;
                    if let Err(error) = crate::sandboxes::reap(&reaper_state).await {
                        tracing::warn!(error = format!("{error:#}"), "the sandbox reaper failed");
                    }
                    if let Err(error) = crate::runs::reap(&reaper_state).await {
                        tracing::warn!(error = format!("{error:#}"), "the run reaper failed");
                    }
                    if let Err(error) = crate::usage::charge_all(&reaper_state).await {
                        tracing::warn!(error = format!("{error:#}"), "charging usage failed");
                    }
                    if let Err(error) = crate::credits::stop_at_caps(&reaper_state).await {
                        tracing::warn!(
                            error = format!("{error:#}"),
                            "stopping at spend caps failed"
                        );
                    }
                    if let Err(error) = crate::credits::stop_when_exhausted(&reaper_state).await {
                        tracing::warn!(
                            error = format!("{error:#}"),
                            "stopping at zero credits failed"
                        );
                    }
                }
            }
            .instrument(tracing::info_span!("sandbox_reaper")),
        ));

        background.push(tokio::spawn(
            crate::runs::dispatch_forever(
                state.clone(),
                Arc::new(tokio::sync::Semaphore::new(
                    state.settings.runs.max_concurrent,
                )),
            )
            .instrument(tracing::info_span!("run_dispatcher")),
        ));

        let listener = TcpListener::bind(state.settings.server.listen)
            .await
            .with_context(|| format!("binding server.listen ({})", state.settings.server.listen))?;
        let local_addr = listener.local_addr().context("reading the bound address")?;
        Ok(Application {
            listener,
            local_addr,
            router,
            state,
            background,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn state(&self) -> &AppState {
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
            state,
            background,
            ..
        } = self;
        let (stop_sender, mut stop_receiver) = tokio::sync::watch::channel(false);
        let server = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = stop_receiver.wait_for(|stop| *stop).await;
        })
        .into_future();
        tokio::pin!(server);
        tokio::select! {
            result = &mut server => {
                result.context("serving HTTP")?;
            }
            () = shutdown => {
                tracing::info!("shutting down: finishing in-flight requests");
                let _ = stop_sender.send(true);
                let grace = Duration::from_secs(state.settings.server.shutdown_grace_secs);
                match tokio::time::timeout(grace, &mut server).await {
                    Ok(result) => result.context("serving HTTP")?,
                    Err(_) => tracing::warn!("in-flight requests did not finish within the grace period"),
                }
            }
        }
        for task in background {
            task.abort();
        }
        if let Err(error) = state.last_used.flush(&state.db).await {
            tracing::warn!(error = %error, "writing API key last-used times at shutdown failed");
        }
        state.db.close().await;
        Ok(())
    }
}
