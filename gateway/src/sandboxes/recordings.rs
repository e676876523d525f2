//! Recordings of terminal sessions: a row made before the session opens (so the worker's
//! chunks have somewhere to go), the chunks the worker sends kept in the artifact store in
//! order, the end it reports (with the session's close in the audit log, carrying the
//! recording's id), and reading them back as one asciicast v2 document — also after the
//! sandbox is gone, until `sandboxes.recording_retention_secs`.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt};
use sandbase_api::internal::{CommandRecording, RecordingEnd};
use sandbase_api::terminals::Recording;
use uuid::Uuid;

use super::row::Owner;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Largest chunk a worker may send.
pub const MAX_CHUNK: usize = 4 * 1024 * 1024;
/// Most chunks of one recording (a few GiB at most).
const MAX_CHUNKS: u32 = 100_000;
const EXPIRE_BATCH: i64 = 100;

const COLUMNS: &str = "id, team_id, sandbox_id, kind, session, shell_session, api_key_id, \
    user_id, command, with_input, started_at, ended_at, duration_ms, bytes, chunks, exit_code, \
    expires_at";

/// The recordings a team sees: every command's, and terminal sessions' once they opened.
const VISIBLE: &str = "(kind <> 'terminal' OR session IS NOT NULL)";

/// Whose recordings a reader sees (`$R`: whether the reader sees everyone's): admins and
/// owners every recording of the team; members only those made by members (themselves
/// included) — an admin's session may show what a member must not see. The maker's role is
/// its key's, else its person's; a recording made by nobody known counts as an owner's.
const READABLE: &str = "($R::boolean OR coalesce( \
     (SELECT k.role FROM api_keys k WHERE k.id = recordings.api_key_id), \
     (SELECT m.role FROM team_members m \
      WHERE m.team_id = recordings.team_id AND m.user_id = recordings.user_id), \
     'owner') = 'member')";

/// Who reads recordings: a team, and whether every recording of it (admins and owners) or
/// only those made by members.
#[derive(Debug, Clone, Copy)]
pub struct Reader {
    pub team_id: Uuid,
    pub everyone: bool,
}

fn readable(position: u8) -> String {
    READABLE.replace("$R", &format!("${position}"))
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RecordingRow {
    pub id: Uuid,
    pub team_id: Uuid,
    pub sandbox_id: Uuid,
    pub kind: String,
    pub session: Option<i32>,
    pub shell_session: Option<String>,
    pub api_key_id: Option<Uuid>,
    pub user_id: Option<Uuid>,
    pub command: sqlx::types::Json<Vec<String>>,
    pub with_input: bool,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub duration_ms: Option<i64>,
    pub bytes: i64,
    pub chunks: i32,
    pub exit_code: Option<i32>,
    pub expires_at: DateTime<Utc>,
}

impl RecordingRow {
    pub fn to_api(&self) -> Recording {
        Recording {
            id: self.id,
            sandbox_id: self.sandbox_id,
            kind: self.kind.clone(),
            session_id: self.session.map(|session| session as u32),
            shell_session: self.shell_session.clone(),
            command: self.command.0.clone(),
            with_input: self.with_input,
            started_at: self.started_at,
            ended_at: self.ended_at,
            duration_ms: self.duration_ms,
            bytes: self.bytes,
            exit_code: self.exit_code,
            expires_at: self.expires_at,
        }
    }
}

/// What a recording is of.
pub struct NewRecording<'a> {
    pub owner: Owner,
    pub sandbox_id: Uuid,
    pub command: &'a [String],
    pub with_input: bool,
}

/// `recording_quota_reached` when the team's kept recordings fill its quota
/// (`sandboxes.recording_quota_mb`): asked before a command or session is recorded, and
/// before a worker's recording is kept.
pub async fn check_quota(state: &AppState, team_id: Uuid) -> ApiResult<()> {
    let quota_mb = state.settings.sandboxes.recording_quota_mb;
    if quota_mb == 0 {
        return Ok(());
    }
    let cache = &state.sandboxes.recording_usage;
    let used = match cache.get(team_id) {
        Some(used) => used,
        None => {
            let used: i64 = sqlx::query_scalar(
                "SELECT coalesce(sum(bytes), 0)::bigint FROM recordings \
                 WHERE team_id = $1 AND expires_at > now()",
            )
            .bind(team_id)
            .fetch_one(&state.db)
            .await?;
            let used = used.max(0) as u64;
            cache.put(team_id, used);
            used
        }
    };
    if used >= quota_mb.saturating_mul(1024 * 1024) {
        return Err(ApiError::RecordingQuotaReached {
            used_mb: used.div_ceil(1024 * 1024),
            quota_mb,
        });
    }
    Ok(())
}

/// Deletes one recording's row of a team; its chunk count, for [`delete_chunks`] once the
/// transaction is committed.
pub async fn delete_row(
    connection: &mut sqlx::PgConnection,
    team_id: Uuid,
    id: Uuid,
) -> ApiResult<u32> {
    let deleted: Option<(i32,)> =
        sqlx::query_as("DELETE FROM recordings WHERE id = $1 AND team_id = $2 RETURNING chunks")
            .bind(id)
            .bind(team_id)
            .fetch_optional(&mut *connection)
            .await?;
    let (chunks,) = deleted.ok_or(ApiError::NotFound("recording"))?;
    Ok(chunks.max(0) as u32)
}

/// Deletes a deleted recording's chunks from the artifact store.
pub async fn delete_chunks(state: &AppState, team_id: Uuid, id: Uuid, chunks: u32) {
    for chunk in 0..chunks {
        let key = state.sandboxes.artifacts.recording(team_id, id, chunk);
        state.sandboxes.artifacts.delete(&key).await;
    }
}

/// The row of a session about to open, for a sandbox of the owner's team only (another
/// team's sandbox, or none, is not found and leaves no row).
pub async fn create(state: &AppState, new: NewRecording<'_>) -> ApiResult<Uuid> {
    let id = Uuid::now_v7();
    let inserted = sqlx::query(
        "INSERT INTO recordings (id, team_id, sandbox_id, api_key_id, user_id, command, with_input, \
           expires_at) \
         SELECT $1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8) \
         FROM sandboxes WHERE id = $3 AND team_id = $2",
    )
    .bind(id)
    .bind(new.owner.team_id)
    .bind(new.sandbox_id)
    .bind(new.owner.api_key_id)
    .bind(new.owner.user_id)
    .bind(sqlx::types::Json(new.command))
    .bind(new.with_input)
    .bind(state.settings.sandboxes.recording_retention_secs as f64)
    .execute(&state.db)
    .await?;
    if inserted.rows_affected() == 0 {
        return Err(ApiError::NotFound("sandbox"));
    }
    Ok(id)
}

/// The session it records opened with this number (or never did: the row goes).
pub async fn opened(state: &AppState, id: Uuid, session: Option<u32>) -> ApiResult<()> {
    let query = match session {
        Some(session) => sqlx::query("UPDATE recordings SET session = $2 WHERE id = $1")
            .bind(id)
            .bind(session as i32),
        None => sqlx::query("DELETE FROM recordings WHERE id = $1").bind(id),
    };
    query.execute(&state.db).await?;
    Ok(())
}

/// The recording a worker writes: only one of a sandbox it hosts.
async fn of_worker(state: &AppState, worker: &str, id: Uuid) -> ApiResult<RecordingRow> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM recordings r WHERE id = $1 AND EXISTS ( \
             SELECT 1 FROM sandboxes s WHERE s.id = r.sandbox_id AND s.worker_id = $2)"
    ))
    .bind(id)
    .bind(worker)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("recording"))
}

/// Keeps chunk `chunk` of a recording a worker sends (a resend replaces it).
pub async fn put_chunk(
    state: &AppState,
    worker: &str,
    id: Uuid,
    chunk: u32,
    bytes: Bytes,
) -> ApiResult<()> {
    if chunk >= MAX_CHUNKS {
        return Err(ApiError::InvalidRequest(format!(
            "a recording has at most {MAX_CHUNKS} chunks"
        )));
    }
    let row = of_worker(state, worker, id).await?;
    check_quota(state, row.team_id).await?;
    let size = bytes.len() as i64;
    state
        .sandboxes
        .artifacts
        .put(
            &state.sandboxes.artifacts.recording(row.team_id, id, chunk),
            bytes.to_vec(),
        )
        .await?;
    sqlx::query(
        "UPDATE recordings SET chunks = greatest(chunks, $2), bytes = bytes + $3 WHERE id = $1",
    )
    .bind(id)
    .bind(chunk as i32 + 1)
    .bind(size)
    .execute(&state.db)
    .await?;
    state
        .sandboxes
        .recording_usage
        .add(row.team_id, size as u64);
    Ok(())
}

/// The session ended: its duration and exit code, and the close in the audit log (by the
/// key or person who opened it, with the recording's id).
pub async fn end(state: &AppState, worker: &str, id: Uuid, end: RecordingEnd) -> ApiResult<()> {
    let row = of_worker(state, worker, id).await?;
    let mut transaction = state.db.begin().await?;
    let updated = sqlx::query(
        "UPDATE recordings SET ended_at = now(), duration_ms = $2, exit_code = $3 \
         WHERE id = $1 AND ended_at IS NULL",
    )
    .bind(id)
    .bind(i64::try_from(end.duration_ms).unwrap_or(i64::MAX))
    .bind(end.exit_code)
    .execute(&mut *transaction)
    .await?;
    if updated.rows_affected() == 1 {
        let (actor_type, actor_id) = match (row.api_key_id, row.user_id) {
            (Some(key), _) => ("api_key", Some(key.to_string())),
            (None, Some(user)) => ("user", Some(user.to_string())),
            (None, None) => ("system", None),
        };
        crate::audit::insert(
            &mut transaction,
            &crate::audit::Entry {
                team_id: Some(row.team_id),
                actor_type,
                actor_id,
                action: "sandbox.session.close".to_owned(),
                target: Some(format!("sandbox:{}", row.sandbox_id)),
                outcome: "success",
                status_code: None,
                details: serde_json::json!({
                    "session": row.session,
                    "recording": id,
                    "exit_code": end.exit_code,
                    "duration_ms": end.duration_ms,
                }),
            },
            None,
            None,
        )
        .await?;
    }
    transaction.commit().await?;
    Ok(())
}

/// A command's recording a worker sends whole, once the command ended: only of a sandbox it
/// hosts, attributed to the key or person the gateway named when they are of the sandbox's
/// team (a resend changes nothing).
pub async fn put_whole(
    state: &AppState,
    worker: &str,
    id: Uuid,
    meta: &CommandRecording,
    cast: Bytes,
) -> ApiResult<()> {
    if !matches!(meta.kind.as_str(), "exec" | "shell") {
        return Err(ApiError::InvalidRequest(
            "a command's recording is of kind exec or shell".to_owned(),
        ));
    }
    let team: Option<(Uuid,)> =
        sqlx::query_as("SELECT team_id FROM sandboxes WHERE id = $1 AND worker_id = $2")
            .bind(meta.sandbox)
            .bind(worker)
            .fetch_optional(&state.db)
            .await?;
    let (team,) = team.ok_or(ApiError::NotFound("sandbox"))?;
    // An id already taken is a resend of this sandbox's recording (nothing to do) or another
    // recording's (refused): its content is never overwritten.
    let taken: Option<(Uuid,)> = sqlx::query_as("SELECT sandbox_id FROM recordings WHERE id = $1")
        .bind(id)
        .fetch_optional(&state.db)
        .await?;
    match taken {
        Some((sandbox,)) if sandbox == meta.sandbox => return Ok(()),
        Some(_) => return Err(ApiError::NotFound("sandbox")),
        None => {}
    }
    check_quota(state, team).await?;
    let size = cast.len() as i64;
    state
        .sandboxes
        .artifacts
        .put(&state.sandboxes.artifacts.recording(team, id, 0), cast)
        .await?;
    sqlx::query(
        "INSERT INTO recordings (id, team_id, sandbox_id, kind, shell_session, api_key_id, \
           user_id, command, with_input, started_at, ended_at, duration_ms, bytes, chunks, \
           exit_code, expires_at) \
         VALUES ($1, $2, $3, $4, $5, \
           (SELECT id FROM api_keys WHERE id = $6 AND team_id = $2), \
           (SELECT user_id FROM team_members WHERE user_id = $7 AND team_id = $2), \
           $8, true, now() - make_interval(secs => $9), now(), $10, $11, 1, $12, \
           now() + make_interval(secs => $13)) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(id)
    .bind(team)
    .bind(meta.sandbox)
    .bind(&meta.kind)
    .bind(meta.shell_session.as_deref())
    .bind(meta.by.api_key_id)
    .bind(meta.by.user_id)
    .bind(sqlx::types::Json(&meta.command))
    .bind(meta.duration_ms as f64 / 1000.0)
    .bind(i64::try_from(meta.duration_ms).unwrap_or(i64::MAX))
    .bind(size)
    .bind(meta.exit_code)
    .bind(state.settings.sandboxes.recording_retention_secs as f64)
    .execute(&state.db)
    .await?;
    state.sandboxes.recording_usage.add(team, size as u64);
    Ok(())
}

/// One recording of a team, if the reader may see it.
pub async fn find(state: &AppState, reader: Reader, id: Uuid) -> ApiResult<RecordingRow> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM recordings WHERE id = $1 AND team_id = $2 AND {VISIBLE} AND {}",
        readable(3)
    ))
    .bind(id)
    .bind(reader.team_id)
    .bind(reader.everyone)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("recording"))
}

/// The recording of a team's terminal session, if the reader may see it.
pub async fn of_session(
    state: &AppState,
    reader: Reader,
    sandbox: Uuid,
    session: u32,
) -> ApiResult<RecordingRow> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM recordings \
         WHERE team_id = $1 AND sandbox_id = $2 AND session = $3 AND {}",
        readable(4)
    ))
    .bind(reader.team_id)
    .bind(sandbox)
    .bind(session as i32)
    .bind(reader.everyone)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("recording"))
}

/// A team's recordings the reader may see (of one sandbox), newest first.
pub async fn list(
    state: &AppState,
    reader: Reader,
    sandbox: Option<Uuid>,
    limit: i64,
) -> ApiResult<Vec<RecordingRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM recordings WHERE team_id = $1 AND {VISIBLE} \
           AND ($2::uuid IS NULL OR sandbox_id = $2) AND {} \
         ORDER BY started_at DESC, id DESC LIMIT $3",
        readable(4)
    ))
    .bind(reader.team_id)
    .bind(sandbox)
    .bind(limit)
    .bind(reader.everyone)
    .fetch_all(&state.db)
    .await?)
}

/// The recording as one asciicast v2 document: its chunks in order, as they are read.
pub fn content(
    state: &AppState,
    row: &RecordingRow,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + use<> {
    let state = state.clone();
    let (team, id, chunks) = (row.team_id, row.id, row.chunks.max(0) as u32);
    futures_util::stream::iter(0..chunks).then(move |chunk| {
        let state = state.clone();
        async move {
            let key = state.sandboxes.artifacts.recording(team, id, chunk);
            match state.sandboxes.artifacts.read(&key).await {
                Ok(bytes) => Ok(Bytes::from(bytes.unwrap_or_default())),
                Err(error) => Err(std::io::Error::other(format!("{error:#}"))),
            }
        }
    })
}

/// Deletes recordings past their retention; returns how many went.
pub async fn expire(state: &AppState) -> anyhow::Result<usize> {
    let expired: Vec<(Uuid, Uuid, i32)> = sqlx::query_as(
        "DELETE FROM recordings WHERE id IN ( \
             SELECT id FROM recordings WHERE expires_at <= now() \
             ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
         RETURNING team_id, id, chunks",
    )
    .bind(EXPIRE_BATCH)
    .fetch_all(&state.db)
    .await?;
    for (team, id, chunks) in &expired {
        for chunk in 0..(*chunks).max(0) as u32 {
            state
                .sandboxes
                .artifacts
                .delete(&state.sandboxes.artifacts.recording(*team, *id, chunk))
                .await;
        }
    }
    Ok(expired.len())
}
