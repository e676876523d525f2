//! Snapshots: a sandbox's `/work` and `/tmp` (everything it can change; its root is
//! read-only) archived by its agent with modes, owners and times, streamed into the artifact
//! store, and unpacked into a new sandbox of the same template before it is handed over.
//! Kept until `sandboxes.snapshot_retention_secs`, metered as storage meanwhile.

use uuid::Uuid;

use super::forward::forward;
use super::row::Owner;
pub use super::row::SnapshotRow;
use crate::audit::Requester;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::workers::WorkerAddress;
use crate::workers::client::{ArchiveOwner, SandboxCall};

/// What a snapshot holds: (part, directory).
pub const PARTS: [(&str, &str); 2] = [("work", "/work"), ("tmp", "/tmp")];

/// Bytes sent to the agent at a time when restoring.
const RESTORE_CHUNK: usize = 1024 * 1024;

/// Snapshots deleted per pass.
const EXPIRE_BATCH: i64 = 100;

const COLUMNS: &str =
    "id, team_id, sandbox_id, template, isolation, size_bytes, created_at, expires_at";

/// Takes a snapshot of a live sandbox of `owner`'s team: each part streamed from its agent
/// into the store, then the row with `requester`'s audit row (nothing of a failed snapshot
/// is kept).
pub async fn take(
    state: &AppState,
    owner: Owner,
    requester: Requester<'_>,
    sandbox_id: Uuid,
) -> ApiResult<SnapshotRow> {
    let sandbox = super::row::fetch(&state.db, owner.team_id, sandbox_id)
        .await?
        .ok_or(ApiError::NotFound("sandbox"))?;
    let id = Uuid::now_v7();
    let mut size = 0u64;
    for (part, path) in PARTS {
        let call = SandboxCall::ArchiveOut {
            path: path.to_owned(),
        };
        let stored = match forward(state, owner.team_id, sandbox_id, call).await {
            Ok(answer) => {
                let key = state.sandboxes.artifacts.snapshot(owner.team_id, id, part);
                state
                    .sandboxes
                    .artifacts
                    .put_stream(key, answer.into_response())
                    .await
            }
            Err(error) => {
                delete_parts(state, owner.team_id, id).await;
                return Err(error);
            }
        };
        match stored {
            Ok(bytes) => size += bytes,
            Err(error) => {
                delete_parts(state, owner.team_id, id).await;
                return Err(ApiError::Internal(error));
            }
        }
    }
    let inserted = insert(state, owner, requester, &sandbox, id, size).await;
    match inserted {
        Ok(row) => Ok(row),
        Err(error) => {
            delete_parts(state, owner.team_id, id).await;
            Err(error)
        }
    }
}

/// The row of a snapshot whose parts are stored, and its audit row, in one transaction.
async fn insert(
    state: &AppState,
    owner: Owner,
    requester: Requester<'_>,
    sandbox: &super::SandboxRow,
    id: Uuid,
    size: u64,
) -> ApiResult<SnapshotRow> {
    let mut transaction = state.db.begin().await?;
    let row: SnapshotRow = sqlx::query_as(&format!(
        "INSERT INTO snapshots (id, team_id, sandbox_id, api_key_id, user_id, template, isolation, \
           size_bytes, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9)) \
         RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(owner.team_id)
    .bind(sandbox.id)
    .bind(owner.api_key_id)
    .bind(owner.user_id)
    .bind(&sandbox.template)
    .bind(&sandbox.isolation)
    .bind(i64::try_from(size).unwrap_or(i64::MAX))
    .bind(state.settings.sandboxes.snapshot_retention_secs as f64)
    .fetch_one(&mut *transaction)
    .await?;
    requester
        .record(
            &mut transaction,
            Some(format!("snapshot:{id}")),
            serde_json::json!({ "sandbox": sandbox.id, "size_bytes": row.size_bytes }),
        )
        .await?;
    transaction.commit().await?;
    Ok(row)
}

/// One snapshot of a team, not yet expired.
pub async fn find(state: &AppState, team_id: Uuid, id: Uuid) -> ApiResult<SnapshotRow> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM snapshots WHERE id = $1 AND team_id = $2 AND expires_at > now()"
    ))
    .bind(id)
    .bind(team_id)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("snapshot"))
}

/// A team's snapshots, newest first.
pub async fn list(state: &AppState, team_id: Uuid, limit: i64) -> ApiResult<Vec<SnapshotRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM snapshots WHERE team_id = $1 AND expires_at > now() \
         ORDER BY created_at DESC, id DESC LIMIT $2"
    ))
    .bind(team_id)
    .bind(limit)
    .fetch_all(&state.db)
    .await?)
}

/// Deletes a team's snapshot: its row with `requester`'s audit row, then its archives.
pub async fn delete(
    state: &AppState,
    team_id: Uuid,
    requester: Requester<'_>,
    id: Uuid,
) -> ApiResult<()> {
    let mut transaction = state.db.begin().await?;
    let deleted = sqlx::query("DELETE FROM snapshots WHERE id = $1 AND team_id = $2")
        .bind(id)
        .bind(team_id)
        .execute(&mut *transaction)
        .await?;
    if deleted.rows_affected() == 0 {
        return Err(ApiError::NotFound("snapshot"));
    }
    requester
        .record(
            &mut transaction,
            Some(format!("snapshot:{id}")),
            serde_json::json!({}),
        )
        .await?;
    transaction.commit().await?;
    delete_parts(state, team_id, id).await;
    Ok(())
}

/// Unpacks a snapshot into a sandbox just started on `worker`, with the owners it recorded
/// (a sandbox too small for it answers the worker's `disk_full`).
pub async fn restore(
    state: &AppState,
    worker: &WorkerAddress,
    sandbox_id: Uuid,
    snapshot: &SnapshotRow,
) -> ApiResult<()> {
    for (part, path) in PARTS {
        let key = state
            .sandboxes
            .artifacts
            .snapshot(snapshot.team_id, snapshot.id, part);
        let Some((_, stream)) = state.sandboxes.artifacts.get(&key).await? else {
            return Err(ApiError::Internal(anyhow::anyhow!(
                "snapshot {} has no {part} archive",
                snapshot.id
            )));
        };
        state
            .sandboxes
            .worker_client
            .put_archive(
                worker,
                sandbox_id,
                path,
                ArchiveOwner::Archived,
                reqwest::Body::wrap_stream(rechunked(stream)),
            )
            .await?;
    }
    Ok(())
}

/// The store's stream in chunks of about [`RESTORE_CHUNK`] (a local store reads 8 KiB at a
/// time; each chunk becomes a frame to the agent).
fn rechunked(
    stream: futures_util::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
) -> impl futures_util::Stream<Item = object_store::Result<bytes::Bytes>> {
    use futures_util::StreamExt;
    futures_util::stream::unfold(Some(stream), |stream| async move {
        let mut stream = stream?;
        let mut buffer = bytes::BytesMut::new();
        while buffer.len() < RESTORE_CHUNK {
            match stream.next().await {
                Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                Some(Err(error)) => return Some((Err(error), None)),
                None if buffer.is_empty() => return None,
                None => return Some((Ok(buffer.freeze()), None)),
            }
        }
        Some((Ok(buffer.freeze()), Some(stream)))
    })
}

async fn delete_parts(state: &AppState, team_id: Uuid, id: Uuid) {
    for (part, _) in PARTS {
        state
            .sandboxes
            .artifacts
            .delete(&state.sandboxes.artifacts.snapshot(team_id, id, part))
            .await;
    }
}

/// Deletes snapshots past their retention; returns how many went.
pub async fn expire(state: &AppState) -> anyhow::Result<usize> {
    let expired: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "DELETE FROM snapshots WHERE id IN ( \
             SELECT id FROM snapshots WHERE expires_at <= now() \
             ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
         RETURNING team_id, id",
    )
    .bind(EXPIRE_BATCH)
    .fetch_all(&state.db)
    .await?;
    for (team, id) in &expired {
        delete_parts(state, *team, *id).await;
    }
    Ok(expired.len())
}
