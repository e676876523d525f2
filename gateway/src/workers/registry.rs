//! The live workers: what each one's last heartbeat said (capacity, templates, warm
//! sandboxes, volumes), kept in Redis where every gateway's placement reads it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use redis::AsyncCommands;
use sandbase_api::internal::{TemplateInfo, WorkerStatus};
use uuid::Uuid;

use crate::config::Settings;
use crate::error::{ApiError, ApiResult};
use crate::workers::WorkerAddress;

/// How long a read of the live workers is reused.
const SNAPSHOT_TTL: Duration = Duration::from_millis(500);

pub struct Workers {
    redis: redis::aio::ConnectionManager,
    key: String,
    heartbeat_ttl_ms: i64,
    snapshot: Mutex<Option<(Instant, Arc<Vec<WorkerStatus>>)>>,
}

impl Workers {
    pub fn new(settings: &Settings, redis: redis::aio::ConnectionManager) -> Workers {
        Workers {
            redis,
            key: format!("{}workers", settings.redis.key_prefix),
            heartbeat_ttl_ms: settings.workers.heartbeat_ttl_secs as i64 * 1000,
            snapshot: Mutex::new(None),
        }
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

    /// Workers that can host `placement`, best first: warm sandboxes of its template, then
    /// free room. A worker qualifies when it has the template, offers the isolation level,
    /// and offers every volume of the mounts (a writable mount: writable by the team).
    pub async fn candidates(&self, placement: &Placement<'_>) -> ApiResult<Vec<WorkerStatus>> {
        let live = self.live().await?;
        if live.is_empty() {
            return Err(ApiError::NoWorkers);
        }
        let template = placement.template;
        let offering: Vec<&WorkerStatus> = live
            .iter()
            .filter(|worker| worker.isolations.contains(&placement.isolation))
            .collect();
        if offering.is_empty() {
            return Err(ApiError::IsolationUnavailable(placement.isolation.as_str()));
        }
        let mut candidates: Vec<(u32, u32, WorkerStatus)> = offering
            .into_iter()
            .filter(|worker| placement.mounts_fit(worker))
            .filter_map(|worker| {
                let info: &TemplateInfo =
                    worker.templates.iter().find(|info| info.name == template)?;
                let free = worker.capacity.saturating_sub(worker.running);
                Some((info.warm.min(free), free, worker.clone()))
            })
            .collect();
        if candidates.is_empty() {
            if !placement.mounts.is_empty() {
                return Err(ApiError::VolumeNotFound(template.to_owned()));
            }
            return Err(ApiError::TemplateNotFound(template.to_owned()));
        }
        // A worker whose creates keep failing gets none until it says it is well again.
        candidates.retain(|(_, _, worker)| worker.healthy);
        if candidates.is_empty() {
            return Err(ApiError::NoCapacity);
        }
        candidates.sort_by_key(|(warm, free, _)| std::cmp::Reverse((*warm, *free)));
        Ok(candidates
            .into_iter()
            .map(|(_, _, worker)| worker)
            .collect())
    }

    /// The id and internal API address of a live worker.
    pub async fn address_of(&self, worker_id: &str) -> ApiResult<WorkerAddress> {
        let find = |workers: &[WorkerStatus]| {
            workers
                .iter()
                .find(|worker| worker.id == worker_id)
                .map(address)
        };
        if let Some(url) = find(&self.live().await?) {
            return Ok(url);
        }
        find(&self.refresh().await?).ok_or(ApiError::WorkerUnavailable)
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

    /// Records what a worker's registration or heartbeat said.
    pub async fn put(&self, status: &WorkerStatus) -> ApiResult<()> {
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

/// Where to reach a worker, and who it is.
pub fn address(worker: &WorkerStatus) -> WorkerAddress {
    WorkerAddress {
        id: worker.id.clone(),
        url: worker.url.clone(),
    }
}

/// What a sandbox needs of its worker.
pub struct Placement<'a> {
    pub template: &'a str,
    pub mounts: &'a [sandbase_api::sandboxes::Mount],
    pub isolation: sandbase_api::sandboxes::Isolation,
    /// The team it is for: writable volumes are offered to the teams named only.
    pub team_id: Uuid,
}

impl Placement<'_> {
    fn mounts_fit(&self, worker: &WorkerStatus) -> bool {
        self.mounts.iter().all(|mount| {
            worker.volumes.iter().any(|volume| {
                volume.name == mount.volume
                    && (mount.read_only
                        || (volume.writable && volume.writers.contains(&self.team_id)))
            })
        })
    }
}
