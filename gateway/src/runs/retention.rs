//! Kept artifacts: deleted once `runs.artifact_retention_secs` have passed since their run
//! finished, and metered until then as `storage_mb_seconds` usage of their team (one event per
//! artifact and metering period, so a period is counted once however often this runs and on
//! however many gateways).

use std::time::Duration;

use uuid::Uuid;

use crate::state::AppState;

/// Artifacts deleted per pass.
const BATCH: i64 = 100;

/// Deletes the artifacts whose retention is over, and fails the runs that waited in the
/// queue as long (deleting their inputs); returns how many artifacts and inputs went.
pub async fn expire(state: &AppState) -> anyhow::Result<usize> {
    let retention = Duration::from_secs(state.settings.runs.artifact_retention_secs);
    let mut connection = state.db.acquire().await?;
    let stale =
        super::lifecycle::fail_stale_queued(&mut connection, retention.as_secs_f64()).await?;
    drop(connection);
    for (team, run, has_inputs) in &stale {
        if *has_inputs {
            state
                .sandboxes
                .artifacts
                .delete(&state.sandboxes.artifacts.inputs(*team, *run))
                .await;
        }
    }
    let expired: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "UPDATE runs SET artifact_deleted_at = now() WHERE id IN ( \
             SELECT id FROM runs WHERE artifact_size IS NOT NULL AND artifact_deleted_at IS NULL \
             AND finished_at < now() - make_interval(secs => $1) \
             ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
         RETURNING team_id, id",
    )
    .bind(retention.as_secs_f64())
    .bind(BATCH)
    .fetch_all(&state.db)
    .await?;
    for (team, run) in &expired {
        state
            .sandboxes
            .artifacts
            .delete(&state.sandboxes.artifacts.artifact(*team, *run))
            .await;
    }
    Ok(expired.len() + stale.len())
}

/// Records the current metering period's storage usage of every kept artifact, queued
/// run's inputs, snapshot and recording (once per object and period); the charger prices and debits it like any other usage.
pub async fn meter(state: &AppState) -> anyhow::Result<u64> {
    let period = state.settings.runs.storage_meter_secs.max(1);
    let now = chrono::Utc::now().timestamp().max(0) as u64;
    let bucket = now / period;
    let inserted = sqlx::query(
        "INSERT INTO usage_events (event_key, team_id, api_key_id, kind, subject, quantity, occurred_at) \
         SELECT 'storage:' || id || ':' || $1::text, team_id, api_key_id, 'storage_mb_seconds', '', \
                ((artifact_size + 1048575) / 1048576) * $2, now() \
         FROM runs WHERE artifact_size IS NOT NULL AND artifact_deleted_at IS NULL \
         UNION ALL \
         SELECT 'storage-inputs:' || id || ':' || $1::text, team_id, api_key_id, \
                'storage_mb_seconds', '', ((inputs_size + 1048575) / 1048576) * $2, now() \
         FROM runs WHERE state = $3 AND inputs_size IS NOT NULL \
         UNION ALL \
         SELECT 'storage-snapshot:' || id || ':' || $1::text, team_id, api_key_id, \
                'storage_mb_seconds', '', ((size_bytes + 1048575) / 1048576) * $2, now() \
         FROM snapshots WHERE expires_at > now() \
         UNION ALL \
         SELECT 'storage-recording:' || id || ':' || $1::text, team_id, api_key_id, \
                'storage_mb_seconds', '', ((bytes + 1048575) / 1048576) * $2, now() \
         FROM recordings WHERE expires_at > now() AND bytes > 0 \
         ON CONFLICT (event_key) DO NOTHING",
    )
    .bind(bucket.to_string())
    .bind(i64::try_from(period).unwrap_or(i64::MAX))
    .bind(super::row::RunState::Queued)
    .execute(&state.db)
    .await?;
    Ok(inserted.rows_affected())
}
