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
    let mut transaction = state.db.begin().await?;
    sqlx::query(
        "INSERT INTO workers (id, url, capacity) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET url = $2, capacity = $3, registered_at = now(), last_seen_at = now()",
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
    let known = sqlx::query(
        "UPDATE workers SET last_seen_at = now(), url = $2, capacity = $3 WHERE id = $1",
    )
    .bind(&beat.id)
    .bind(&beat.url)
    .bind(beat.capacity as i32)
    .execute(&state.db)
    .await?;
    if known.rows_affected() == 0 {
        return Err(ApiError::UnknownWorker);
    }
    // The sandboxes that should be on this worker.
    let live: HashSet<Uuid> = lifecycle::live_on_worker(&state.db, &beat.id)
        .await?
        .into_iter()
        .collect();
    let reported: HashSet<Uuid> = beat.sandboxes.iter().copied().collect();
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
            capacity: beat.capacity,
            running: beat.sandboxes.len() as u32,
            templates: beat.templates,
            volumes: beat.volumes,
            seen_ms: Utc::now().timestamp_millis(),
            healthy: beat.healthy,
            memory_mb: beat.memory_mb,
            reserved_memory_mb: beat.reserved_memory_mb,
            cpu_millis: beat.cpu_millis,
            reserved_cpu_millis: beat.reserved_cpu_millis,
            isolations: beat.isolations,
        })
        .await?;
    Ok(HeartbeatReply { destroy })
}
