//! Registrations and heartbeats: each one reconciles the gateway's rows with what the
//! worker hosts. A registering worker has just removed everything of its predecessor, so
//! its old sandboxes are lost at once; a heartbeat tells the worker which of its sandboxes
//! the gateway no longer has, and the gateway marks lost the running ones the worker no
//! longer has.

use std::collections::HashSet;

use chrono::Utc;
use sandbase_api::internal::{Heartbeat, HeartbeatReply, RegisterWorker, WorkerStatus};
use uuid::Uuid;

use crate::error::{ApiError, ApiResult};
use crate::sandboxes::lifecycle::{self, SystemStop};
use crate::state::AppState;

/// A running sandbox missing from its worker's heartbeat is lost only when older than this
/// (a heartbeat may have been sent just before the sandbox was added).
const MISSING_GRACE_SECS: f64 = 10.0;

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
pub async fn register(state: &AppState, worker: RegisterWorker) -> ApiResult<()> {
    validate_worker(&worker.id, &worker.url)?;
    let max = state.settings.workers.max_capacity;
    if worker.capacity > max {
        metrics::counter!("sandbase_worker_claims_refused_total").increment(1);
        return Err(ApiError::InvalidRequest(format!(
            "a worker may host at most {max} sandboxes (workers.max_capacity)"
        )));
    }
    let mut transaction = state.db.begin().await?;
    let before: Option<i32> = sqlx::query_scalar("SELECT capacity FROM workers WHERE id = $1")
        .bind(&worker.id)
        .fetch_optional(&mut *transaction)
        .await?;
    if let Some(before) = before
        && i64::from(worker.capacity) > 2 * i64::from(before.max(1))
    {
        // Not refused (an operator may give a node more), but told: a stolen credential
        // registering big is how one would attract sandboxes.
        metrics::counter!("sandbase_worker_capacity_jumps_total").increment(1);
        tracing::warn!(worker = %worker.id, before, now = worker.capacity, "a worker registered with far more capacity than before");
    }
    sqlx::query(
        "INSERT INTO workers (id, url, capacity) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET url = $2, capacity = $3, registered_at = now(), \
           last_seen_at = now(), memory_mb = NULL, cpu_millis = NULL",
    )
    .bind(&worker.id)
    .bind(&worker.url)
    .bind(worker.capacity as i32)
    .execute(&mut *transaction)
    .await?;
    let lost =
        lifecycle::stop_system(&mut transaction, SystemStop::WorkerRestarted(&worker.id)).await?;
    transaction.commit().await?;
    if !lost.is_empty() {
        tracing::warn!(worker = %worker.id, count = lost.len(), "a restarted worker lost its sandboxes");
    }
    for stopped in &lost {
        state.sandboxes.routes.forget(stopped.id);
    }
    state
        .sandboxes
        .workers
        .put(&WorkerStatus {
            id: worker.id,
            url: worker.url,
            capacity: worker.capacity,
            running: 0,
            templates: worker.templates,
            volumes: worker.volumes,
            seen_ms: Utc::now().timestamp_millis(),
            healthy: true,
            memory_mb: 0,
            reserved_memory_mb: 0,
            cpu_millis: 0,
            reserved_cpu_millis: 0,
            isolations: worker.isolations,
        })
        .await
}

/// A worker's periodic report. The answer lists sandboxes it should remove; running ones
/// it no longer has are lost.
pub async fn heartbeat(state: &AppState, beat: Heartbeat) -> ApiResult<HeartbeatReply> {
    validate_worker(&beat.id, &beat.url)?;
    // What it registered with bounds what it may claim now: its capacity, and the memory and
    // CPU of its first heartbeat since.
    let claimed: Option<(i32, i64, i64)> = sqlx::query_as(
        "UPDATE workers SET last_seen_at = now(), url = $2, \
           memory_mb = coalesce(memory_mb, $3), cpu_millis = coalesce(cpu_millis, $4) \
         WHERE id = $1 RETURNING capacity, memory_mb, cpu_millis",
    )
    .bind(&beat.id)
    .bind(&beat.url)
    .bind(i64::try_from(beat.memory_mb).unwrap_or(i64::MAX))
    .bind(i64::try_from(beat.cpu_millis).unwrap_or(i64::MAX))
    .fetch_optional(&state.db)
    .await?;
    let (capacity, memory_mb, cpu_millis) = claimed.ok_or(ApiError::UnknownWorker)?;
    let bounds = (
        capacity.max(0) as u32,
        memory_mb.max(0) as u64,
        cpu_millis.max(0) as u64,
    );
    if beat.capacity > bounds.0 || beat.memory_mb > bounds.1 || beat.cpu_millis > bounds.2 {
        metrics::counter!("sandbase_worker_claims_refused_total").increment(1);
        tracing::warn!(worker = %beat.id, "a heartbeat claimed more than its worker registered: held to the registration");
    }
    // The sandboxes that should be on this worker.
    let live: HashSet<Uuid> = lifecycle::live_on_worker(&state.db, &beat.id)
        .await?
        .into_iter()
        .collect();
    let reported: HashSet<Uuid> = beat.sandboxes.iter().copied().collect();
    // Busy is what the worker says or what the gateway placed there, whichever is more: a
    // worker cannot look emptier than it is.
    let running = reported.len().max(live.len()) as u32;
    let destroy: Vec<Uuid> = reported.difference(&live).copied().collect();
    let missing: Vec<Uuid> = live.difference(&reported).copied().collect();
    if !missing.is_empty() {
        let mut transaction = state.db.begin().await?;
        let lost = lifecycle::stop_system(
            &mut transaction,
            SystemStop::MissingFromWorker {
                ids: &missing,
                grace_secs: MISSING_GRACE_SECS,
            },
        )
        .await?;
        transaction.commit().await?;
        for stopped in &lost {
            state.sandboxes.routes.forget(stopped.id);
        }
    }
    lifecycle::follow_idle_pauses(&state.db, &beat.id, &beat.paused).await?;
    state
        .sandboxes
        .workers
        .put(&WorkerStatus {
            id: beat.id,
            url: beat.url,
            capacity: beat.capacity.min(bounds.0),
            running,
            templates: beat.templates,
            volumes: beat.volumes,
            seen_ms: Utc::now().timestamp_millis(),
            healthy: beat.healthy,
            memory_mb: beat.memory_mb.min(bounds.1),
            reserved_memory_mb: beat.reserved_memory_mb,
            cpu_millis: beat.cpu_millis.min(bounds.2),
            reserved_cpu_millis: beat.reserved_cpu_millis,
            isolations: beat.isolations,
        })
        .await?;
    Ok(HeartbeatReply { destroy })
}
