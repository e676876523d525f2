//! The gateway's view of its workers: registration and heartbeats (internal API,
//! authenticated by the node token), the live set in Redis that scheduling reads, and the
//! HTTP client for calls to a worker's internal API.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use chrono::Utc;
use redis::AsyncCommands;
use sandbase_api::internal::{
    Heartbeat, HeartbeatReply, NODE_TOKEN_HEADER, RegisterWorker, TemplateInfo, WorkerStatus,
};
use secrecy::ExposeSecret;
use std::sync::Arc;
use uuid::Uuid;

use crate::config::Settings;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// How long a read of the live workers is reused.
const SNAPSHOT_TTL: Duration = Duration::from_millis(500);
/// A running sandbox missing from its worker's heartbeat is lost only when older than this
/// (a heartbeat may have been sent just before the sandbox was added).
const MISSING_GRACE_SECS: f64 = 10.0;

pub struct Workers {
    redis: redis::aio::ConnectionManager,
    key: String,
    heartbeat_ttl_ms: i64,
    pub http: reqwest::Client,
    token: Option<String>,
    snapshot: Mutex<Option<(Instant, Arc<Vec<WorkerStatus>>)>>,
}

impl Workers {
    pub fn new(
        settings: &Settings,
        redis: redis::aio::ConnectionManager,
    ) -> anyhow::Result<Workers> {
        Ok(Workers {
            redis,
            key: format!("{}workers", settings.redis.key_prefix),
            heartbeat_ttl_ms: settings.workers.heartbeat_ttl_secs as i64 * 1000,
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .pool_idle_timeout(Duration::from_secs(60))
                .build()?,
            token: settings
                .workers
                .node_token
                .as_ref()
                .map(|token| token.expose_secret().to_owned()),
            snapshot: Mutex::new(None),
        })
    }

    /// Whether `headers` carry this deployment's node token (never, without one).
    pub fn authenticates(&self, headers: &HeaderMap) -> bool {
        use subtle::ConstantTimeEq;
        let Some(token) = &self.token else {
            return false;
        };
        headers
            .get(NODE_TOKEN_HEADER)
            .is_some_and(|presented| bool::from(presented.as_bytes().ct_eq(token.as_bytes())))
    }

    /// A request to a worker, carrying the node token.
    pub fn request(&self, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
        self.http
            .request(method, url)
            .header(NODE_TOKEN_HEADER, self.token.as_deref().unwrap_or_default())
    }

    /// The workers that heartbeated recently (cached for half a second).
    pub async fn live(&self) -> ApiResult<Arc<Vec<WorkerStatus>>> {
        if let Some((at, workers)) = self.lock().as_ref()
            && at.elapsed() < SNAPSHOT_TTL
        {
            return Ok(Arc::clone(workers));
        }
        self.refresh().await
    }

    async fn refresh(&self) -> ApiResult<Arc<Vec<WorkerStatus>>> {
        let mut redis = self.redis.clone();
        let all: Vec<String> = redis.hvals(&self.key).await.map_err(|error| {
            ApiError::Unavailable(format!("reading workers from Redis: {error}"))
        })?;
        let cutoff = Utc::now().timestamp_millis() - self.heartbeat_ttl_ms;
        let workers: Vec<WorkerStatus> = all
            .iter()
            .filter_map(|json| serde_json::from_str::<WorkerStatus>(json).ok())
            .filter(|worker| worker.seen_ms >= cutoff)
            .collect();
        let workers = Arc::new(workers);
        *self.lock() = Some((Instant::now(), Arc::clone(&workers)));
        Ok(workers)
    }

    /// Workers that can host `template`, best first: warm sandboxes of it, then free room.
    pub async fn candidates(&self, template: &str) -> ApiResult<Vec<WorkerStatus>> {
        self.candidates_with(template, &[]).await
    }

    /// Like [`Workers::candidates`], among workers offering every volume of `mounts`.
    pub async fn candidates_with(
        &self,
        template: &str,
        mounts: &[sandbase_api::sandboxes::Mount],
    ) -> ApiResult<Vec<WorkerStatus>> {
        let live = self.live().await?;
        if live.is_empty() {
            return Err(ApiError::problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_workers",
                "no worker is connected to this gateway",
            ));
        }
        let mut candidates: Vec<(u32, u32, WorkerStatus)> = live
            .iter()
            .filter(|worker| {
                mounts.iter().all(|mount| {
                    worker.volumes.iter().any(|volume| {
                        volume.name == mount.volume && (mount.read_only || volume.writable)
                    })
                })
            })
            .filter_map(|worker| {
                let info: &TemplateInfo =
                    worker.templates.iter().find(|info| info.name == template)?;
                let free = worker.capacity.saturating_sub(worker.running);
                Some((info.warm.min(free), free, worker.clone()))
            })
            .collect();
        if candidates.is_empty() {
            if !mounts.is_empty() {
                return Err(ApiError::problem(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "volume_not_found",
                    format!(
                        "no worker has the template `{template}` and the volumes asked for (a writable mount needs a writable volume)"
                    ),
                ));
            }
            return Err(ApiError::problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "template_not_found",
                format!("no worker has the template `{template}`"),
            ));
        }
        candidates.sort_by_key(|(warm, free, _)| std::cmp::Reverse((*warm, *free)));
        Ok(candidates
            .into_iter()
            .map(|(_, _, worker)| worker)
            .collect())
    }

    /// The internal API address of a live worker.
    pub async fn url_of(&self, worker_id: &str) -> ApiResult<String> {
        let find = |workers: &[WorkerStatus]| {
            workers
                .iter()
                .find(|worker| worker.id == worker_id)
                .map(|worker| worker.url.clone())
        };
        if let Some(url) = find(&self.live().await?) {
            return Ok(url);
        }
        find(&self.refresh().await?).ok_or_else(|| {
            ApiError::problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "worker_unavailable",
                "the worker hosting this sandbox is not reachable",
            )
        })
    }

    /// Counts a placement against a worker's free room until its next heartbeat.
    pub fn placed(&self, worker_id: &str) {
        if let Some((_, workers)) = self.lock().as_mut() {
            let mut updated: Vec<WorkerStatus> = workers.as_ref().clone();
            if let Some(worker) = updated.iter_mut().find(|worker| worker.id == worker_id) {
                worker.running += 1;
                for template in &mut worker.templates {
                    template.warm = template.warm.saturating_sub(1);
                }
            }
            *workers = Arc::new(updated);
        }
    }

    async fn put(&self, status: &WorkerStatus) -> ApiResult<()> {
        let mut redis = self.redis.clone();
        let json = serde_json::to_string(status).map_err(anyhow::Error::from)?;
        let _: () = redis
            .hset(&self.key, &status.id, json)
            .await
            .map_err(|error| {
                ApiError::Unavailable(format!("writing a worker to Redis: {error}"))
            })?;
        *self.lock() = None;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Arc<Vec<WorkerStatus>>)>> {
        self.snapshot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The internal routes workers call (outside the public API and its document).
pub fn internal_router() -> Router<AppState> {
    Router::new()
        .route("/internal/v1/workers/register", post(register))
        .route("/internal/v1/workers/heartbeat", post(heartbeat))
}

fn check_token(state: &AppState, headers: &HeaderMap) -> ApiResult<()> {
    if state.workers.authenticates(headers) {
        Ok(())
    } else {
        Err(ApiError::problem(
            StatusCode::UNAUTHORIZED,
            "invalid_node_token",
            "missing or wrong node token",
        ))
    }
}

fn validate_worker(id: &str, url: &str) -> ApiResult<()> {
    if id.is_empty() || id.len() > 200 {
        return Err(ApiError::InvalidRequest(
            "a worker id has 1 to 200 characters".to_owned(),
        ));
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ApiError::InvalidRequest(
            "a worker url is an http:// or https:// URL".to_owned(),
        ));
    }
    Ok(())
}

/// A worker (re)starting: it hosts nothing, so whatever it hosted before is lost.
async fn register(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(body): Json<RegisterWorker>,
) -> ApiResult<StatusCode> {
    check_token(&state, &headers)?;
    validate_worker(&body.id, &body.url)?;
    let mut transaction = state.db.begin().await?;
    sqlx::query(
        "INSERT INTO workers (id, url, capacity) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET url = $2, capacity = $3, registered_at = now(), last_seen_at = now()",
    )
    .bind(&body.id)
    .bind(&body.url)
    .bind(body.capacity as i32)
    .execute(&mut *transaction)
    .await?;
    let lost: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "UPDATE sandboxes SET state = 'stopped', stop_reason = 'lost', stopped_at = now() \
         WHERE worker_id = $1 AND state <> 'stopped' RETURNING id, team_id",
    )
    .bind(&body.id)
    .fetch_all(&mut *transaction)
    .await?;
    crate::sandboxes::record_system_stops(
        &mut transaction,
        &lost,
        "sandbox.lost",
        "the worker restarted",
    )
    .await?;
    transaction.commit().await?;
    if !lost.is_empty() {
        tracing::warn!(worker = %body.id, count = lost.len(), "a restarted worker lost its sandboxes");
    }
    for (id, _) in &lost {
        state.routes.forget(*id);
    }
    state
        .workers
        .put(&WorkerStatus {
            id: body.id,
            url: body.url,
            capacity: body.capacity,
            running: 0,
            templates: body.templates,
            volumes: body.volumes,
            seen_ms: Utc::now().timestamp_millis(),
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A worker's periodic report. The answer lists sandboxes it should remove; running ones
/// it no longer has are lost.
async fn heartbeat(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(body): Json<Heartbeat>,
) -> ApiResult<Json<HeartbeatReply>> {
    check_token(&state, &headers)?;
    validate_worker(&body.id, &body.url)?;
    let known = sqlx::query(
        "UPDATE workers SET last_seen_at = now(), url = $2, capacity = $3 WHERE id = $1",
    )
    .bind(&body.id)
    .bind(&body.url)
    .bind(body.capacity as i32)
    .execute(&state.db)
    .await?;
    if known.rows_affected() == 0 {
        return Err(ApiError::problem(
            StatusCode::NOT_FOUND,
            "unknown_worker",
            "this worker is not registered",
        ));
    }
    // The sandboxes that should be on this worker.
    let live: Vec<(Uuid,)> =
        sqlx::query_as("SELECT id FROM sandboxes WHERE worker_id = $1 AND state <> 'stopped'")
            .bind(&body.id)
            .fetch_all(&state.db)
            .await?;
    let live: HashSet<Uuid> = live.into_iter().map(|(id,)| id).collect();
    let reported: HashSet<Uuid> = body.sandboxes.iter().copied().collect();
    let destroy: Vec<Uuid> = reported.difference(&live).copied().collect();
    let missing: Vec<Uuid> = live.difference(&reported).copied().collect();
    if !missing.is_empty() {
        let mut transaction = state.db.begin().await?;
        let lost: Vec<(Uuid, Uuid)> = sqlx::query_as(
            "UPDATE sandboxes SET state = 'stopped', stop_reason = 'lost', stopped_at = now() \
             WHERE id = ANY($1) AND state = 'running' \
               AND created_at < now() - make_interval(secs => $2) RETURNING id, team_id",
        )
        .bind(&missing)
        .bind(MISSING_GRACE_SECS)
        .fetch_all(&mut *transaction)
        .await?;
        crate::sandboxes::record_system_stops(
            &mut transaction,
            &lost,
            "sandbox.lost",
            "missing from its worker",
        )
        .await?;
        transaction.commit().await?;
        for (id, _) in &lost {
            state.routes.forget(*id);
        }
    }
    state
        .workers
        .put(&WorkerStatus {
            id: body.id,
            url: body.url,
            capacity: body.capacity,
            running: body.sandboxes.len() as u32,
            templates: body.templates,
            volumes: body.volumes,
            seen_ms: Utc::now().timestamp_millis(),
        })
        .await?;
    Ok(Json(HeartbeatReply { destroy }))
}
