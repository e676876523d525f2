//! Every change of a sandbox's state and stop reason, and nothing else, happens here: the
//! row is created `creating`, becomes `running` once a worker started it, `paused` and
//! `running` again as it is paused and resumed, and `stopped` with one [`StopReason`].
//! A live sandbox is `running` or `paused`. Functions take the caller's connection or transaction, so a
//! stop and its audit rows commit together.

use sqlx::PgConnection;
use uuid::Uuid;

use super::row::{Owner, SANDBOX_COLUMNS, SandboxRow};
pub use super::row::{SandboxState, StopReason};
use super::validate::NewSandbox;

/// A sandbox the system stopped, and the worker that still has to remove it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Stopped {
    pub id: Uuid,
    pub team_id: Uuid,
    pub worker_id: Option<String>,
}

/// The stops the system makes, each with its reason and its audit action.
#[derive(Debug, Clone, Copy)]
pub enum SystemStop<'a> {
    /// Lifetimes that ended (a batch, oldest first).
    Expired,
    /// Sandboxes of workers silent for longer than this many seconds (a batch).
    WorkerSilent { lost_after_secs: f64 },
    /// Creates a dead gateway left `creating` for longer than this (a batch; not audited:
    /// they never ran).
    Abandoned { after_secs: f64 },
    /// Everything a registering worker hosted before its restart.
    WorkerRestarted(&'a str),
    /// Running sandboxes a worker's heartbeat no longer lists, older than `grace_secs`.
    MissingFromWorker { ids: &'a [Uuid], grace_secs: f64 },
    /// Running sandboxes past their own or their API key's spend cap.
    SpendCap,
    /// A team's running sandboxes, its credits spent.
    CreditsExhausted(Uuid),
    /// Live sandboxes made with an API key since revoked or expired (a batch).
    KeyEnded,
}

impl SystemStop<'_> {
    fn reason(&self) -> StopReason {
        match self {
            SystemStop::Expired => StopReason::Expired,
            SystemStop::Abandoned { .. } => StopReason::Failed,
            SystemStop::WorkerSilent { .. }
            | SystemStop::WorkerRestarted(_)
            | SystemStop::MissingFromWorker { .. } => StopReason::Lost,
            SystemStop::SpendCap => StopReason::SpendCap,
            SystemStop::CreditsExhausted(_) => StopReason::InsufficientCredits,
            SystemStop::KeyEnded => StopReason::KeyRevoked,
        }
    }

    /// The audit action and the reason given, or `None` when the stop is not audited.
    fn audit(&self) -> Option<(&'static str, &'static str)> {
        match self {
            SystemStop::Expired => Some(("sandbox.expire", "its lifetime ended")),
            SystemStop::WorkerSilent { .. } => Some(("sandbox.lost", "its worker went silent")),
            SystemStop::Abandoned { .. } => None,
            SystemStop::WorkerRestarted(_) => Some(("sandbox.lost", "the worker restarted")),
            SystemStop::MissingFromWorker { .. } => {
                Some(("sandbox.lost", "missing from its worker"))
            }
            SystemStop::SpendCap => Some((
                "sandbox.stop_spend_cap",
                "the sandbox's or its API key's spend cap was reached",
            )),
            SystemStop::CreditsExhausted(_) => Some((
                "sandbox.stop_insufficient_credits",
                "the team's credits ran out and the grace period passed",
            )),
            SystemStop::KeyEnded => Some((
                "sandbox.stop_key_revoked",
                "the API key it was made with was revoked or expired",
            )),
        }
    }

    /// The ids to stop. `$1` is `stopped`, `$2` the reason, `$3` `running`, `$4`
    /// `creating`; `$5` the stop's own parameter. A live sandbox (running or paused) is
    /// neither `$1` nor `$4`.
    fn selection(&self) -> &'static str {
        match self {
            SystemStop::Expired => {
                "SELECT id FROM sandboxes WHERE state <> $1 AND expires_at <= now() \
                 ORDER BY expires_at LIMIT 200 FOR UPDATE SKIP LOCKED"
            }
            SystemStop::WorkerSilent { .. } => {
                "SELECT s.id FROM sandboxes s JOIN workers w ON w.id = s.worker_id \
                 WHERE s.state <> $1 AND w.last_seen_at < now() - make_interval(secs => $5) \
                 LIMIT 200 FOR UPDATE OF s SKIP LOCKED"
            }
            SystemStop::Abandoned { .. } => {
                "SELECT id FROM sandboxes WHERE state = $4 \
                 AND created_at < now() - make_interval(secs => $5) LIMIT 200 FOR UPDATE SKIP LOCKED"
            }
            SystemStop::WorkerRestarted(_) => {
                "SELECT id FROM sandboxes WHERE worker_id = $5 AND state <> $1"
            }
            SystemStop::MissingFromWorker { .. } => {
                "SELECT id FROM sandboxes WHERE id = ANY($5) AND state NOT IN ($1, $4) \
                 AND created_at < now() - make_interval(secs => $6)"
            }
            // A key's cap holds for its whole lineage: a sandbox stops when its key or any
            // of the key's ancestors is at its cap.
            SystemStop::SpendCap => {
                "SELECT id FROM sandboxes WHERE state NOT IN ($1, $4) AND ( \
                     (max_credits IS NOT NULL AND spent_micro >= max_credits) \
                     OR api_key_id IN (SELECT k.id FROM api_keys k JOIN api_keys a \
                                         ON a.id = k.id OR a.id = ANY(k.lineage) \
                                       WHERE a.max_credits IS NOT NULL AND a.spent_micro >= a.max_credits))"
            }
            SystemStop::CreditsExhausted(_) => {
                "SELECT id FROM sandboxes WHERE team_id = $5 AND state NOT IN ($1, $4)"
            }
            // Revoking a key revokes its descendants; a child expires no later than its
            // parent: the key's own row says it.
            SystemStop::KeyEnded => {
                "SELECT s.id FROM sandboxes s JOIN api_keys k ON k.id = s.api_key_id \
                 WHERE s.state NOT IN ($1, $4) \
                   AND (k.revoked_at IS NOT NULL OR k.expires_at <= now()) \
                 LIMIT 200 FOR UPDATE OF s SKIP LOCKED"
            }
        }
    }
}

/// Stops what `stop` selects, with its reason, and writes the system's audit rows for them
/// in the caller's transaction.
pub async fn stop_system(
    connection: &mut PgConnection,
    stop: SystemStop<'_>,
) -> Result<Vec<Stopped>, sqlx::Error> {
    let sql = format!(
        "UPDATE sandboxes SET state = $1, stop_reason = $2, stopped_at = now() \
         WHERE id IN ({}) RETURNING id, team_id, worker_id",
        stop.selection()
    );
    let query = sqlx::query_as::<_, Stopped>(&sql)
        .bind(SandboxState::Stopped)
        .bind(stop.reason())
        .bind(SandboxState::Running)
        .bind(SandboxState::Creating);
    let query = match stop {
        SystemStop::Expired | SystemStop::SpendCap | SystemStop::KeyEnded => query,
        SystemStop::WorkerSilent {
            lost_after_secs: seconds,
        }
        | SystemStop::Abandoned {
            after_secs: seconds,
        } => query.bind(seconds),
        SystemStop::WorkerRestarted(worker) => query.bind(worker),
        SystemStop::MissingFromWorker { ids, grace_secs } => query.bind(ids).bind(grace_secs),
        SystemStop::CreditsExhausted(team) => query.bind(team),
    };
    let stopped = query.fetch_all(&mut *connection).await?;
    if let Some((action, why)) = stop.audit() {
        for sandbox in &stopped {
            crate::audit::insert(
                connection,
                &crate::audit::Entry {
                    team_id: Some(sandbox.team_id),
                    actor_type: "system",
                    actor_id: None,
                    action: action.to_owned(),
                    target: Some(sandbox.id.to_string()),
                    outcome: "success",
                    status_code: None,
                    details: serde_json::json!({ "reason": why }),
                },
                None,
                None,
            )
            .await?;
        }
    }
    Ok(stopped)
}

/// What a new sandbox's row holds.
pub struct NewRow<'a> {
    pub id: Uuid,
    pub owner: Owner,
    pub sandbox: &'a NewSandbox,
    /// The hash of its store credential, when it has store access.
    pub store_token_hash: Option<Vec<u8>>,
}

/// The row of a sandbox about to be placed: `creating`, on no worker yet.
pub async fn insert_creating(
    connection: &mut PgConnection,
    new: NewRow<'_>,
) -> Result<(), sqlx::Error> {
    let sandbox = new.sandbox;
    let resources = sandbox.resources;
    sqlx::query(
        "INSERT INTO sandboxes (id, team_id, api_key_id, user_id, template, state, worker_id, cwd, \
           cpu_millis, memory_mb, disk_mb, pids, metadata, expires_at, mounts, max_credits, egress, \
           credentials, isolation, auto_pause_secs, store_token_hash) \
         VALUES ($1, $2, $3, $4, $5, $17, NULL, $6, $7, $8, $9, $10, $11, \
           now() + make_interval(secs => $12), $13, $14, $15, $16, $18, $19, $20)",
    )
    .bind(new.id)
    .bind(new.owner.team_id)
    .bind(new.owner.api_key_id)
    .bind(new.owner.user_id)
    .bind(sandbox.template.as_str())
    .bind(&sandbox.cwd)
    .bind(resources.cpu_millis as i32)
    .bind(resources.memory_mb as i32)
    .bind(resources.disk_mb as i32)
    .bind(resources.pids as i32)
    .bind(sqlx::types::Json(&sandbox.metadata))
    .bind(sandbox.timeout_secs as f64)
    .bind(sqlx::types::Json(&sandbox.mounts))
    .bind(sandbox.max_credits)
    .bind(sandbox.egress.as_ref().map(sqlx::types::Json))
    .bind(&sandbox.credentials)
    .bind(SandboxState::Creating)
    .bind(sandbox.isolation.as_str())
    .bind(sandbox.auto_pause_after_idle_secs.map(|secs| secs as i32))
    .bind(new.store_token_hash.as_deref())
    .execute(connection)
    .await?;
    Ok(())
}

/// A team's sandboxes at once: how many it holds (creating or running) and may hold.
pub struct Quota {
    pub held: u32,
    pub max: u32,
}

/// Locks the team's sandbox count until the caller's transaction ends, and reads it with
/// the team's quota (its own, else `default_max`).
pub async fn lock_team_quota(
    connection: &mut PgConnection,
    team_id: Uuid,
    default_max: u32,
) -> Result<Quota, sqlx::Error> {
    let (own_max,): (Option<i32>,) =
        sqlx::query_as("SELECT max_sandboxes FROM teams WHERE id = $1 FOR UPDATE")
            .bind(team_id)
            .fetch_one(&mut *connection)
            .await?;
    // The predicate is written out (not bound) so the planner can use the partial index
    // `sandboxes_team_live`, which holds only live sandboxes: the count never walks a team's
    // history.
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sandboxes WHERE team_id = $1 AND state <> 'stopped'",
    )
    .bind(team_id)
    .fetch_one(connection)
    .await?;
    Ok(Quota {
        held: u32::try_from(held).unwrap_or(u32::MAX),
        max: own_max.map_or(default_max, |max| max.max(1) as u32),
    })
}

/// Notes the worker a `creating` sandbox is being placed on.
pub async fn assign_worker(
    connection: &mut PgConnection,
    id: Uuid,
    worker_id: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE sandboxes SET worker_id = $2 WHERE id = $1")
        .bind(id)
        .bind(worker_id)
        .execute(connection)
        .await?;
    Ok(())
}

/// A worker started it: `creating` → `running`.
pub async fn mark_running(
    connection: &mut PgConnection,
    id: Uuid,
) -> Result<SandboxRow, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE sandboxes SET state = $2 WHERE id = $1 AND state = $3 RETURNING {SANDBOX_COLUMNS}"
    ))
    .bind(id)
    .bind(SandboxState::Running)
    .bind(SandboxState::Creating)
    .fetch_one(connection)
    .await
}

/// No worker started it (a worker that did will be told to remove it at its next heartbeat).
pub async fn mark_failed(connection: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    stop_one(connection, id, StopReason::Failed).await.map(drop)
}

/// Stops one sandbox that is not stopped yet; `None` when it was (or does not exist),
/// else the worker that hosts it.
pub async fn stop_one(
    connection: &mut PgConnection,
    id: Uuid,
    reason: StopReason,
) -> Result<Option<Option<String>>, sqlx::Error> {
    let worker: Option<(Option<String>,)> = sqlx::query_as(
        "UPDATE sandboxes SET state = $2, stop_reason = $3, stopped_at = now() \
         WHERE id = $1 AND state <> $2 RETURNING worker_id",
    )
    .bind(id)
    .bind(SandboxState::Stopped)
    .bind(reason)
    .fetch_optional(connection)
    .await?;
    Ok(worker.map(|(worker_id,)| worker_id))
}

/// What destroying a team's sandbox found.
pub enum Destroyed {
    NotFound,
    AlreadyStopped,
    /// Stopped now; the worker that still has to remove it.
    Stopped {
        worker_id: Option<String>,
    },
}

/// Destroys a sandbox of `team_id` (locked, so a concurrent destroy waits and then finds
/// it stopped).
pub async fn destroy(
    connection: &mut PgConnection,
    team_id: Uuid,
    id: Uuid,
) -> Result<Destroyed, sqlx::Error> {
    let row: Option<(SandboxState, Option<String>)> = sqlx::query_as(
        "SELECT state, worker_id FROM sandboxes WHERE id = $1 AND team_id = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(team_id)
    .fetch_optional(&mut *connection)
    .await?;
    match row {
        None => Ok(Destroyed::NotFound),
        Some((SandboxState::Stopped, _)) => Ok(Destroyed::AlreadyStopped),
        Some((_, worker_id)) => {
            stop_one(connection, id, StopReason::Destroyed).await?;
            Ok(Destroyed::Stopped { worker_id })
        }
    }
}

/// Moves a live sandbox's expiry to `timeout_secs` from now; `None` when it is not a
/// live sandbox of `team_id`.
pub async fn extend(
    connection: &mut PgConnection,
    team_id: Uuid,
    id: Uuid,
    timeout_secs: u64,
) -> Result<Option<SandboxRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE sandboxes SET expires_at = now() + make_interval(secs => $3) \
         WHERE id = $1 AND team_id = $2 AND state IN ($4, $5) RETURNING {SANDBOX_COLUMNS}"
    ))
    .bind(id)
    .bind(team_id)
    .bind(timeout_secs as f64)
    .bind(SandboxState::Running)
    .bind(SandboxState::Paused)
    .fetch_optional(connection)
    .await
}

/// The sandboxes that should be on `worker_id` (not stopped).
pub async fn live_on_worker(
    connection: impl sqlx::PgExecutor<'_>,
    worker_id: &str,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM sandboxes WHERE worker_id = $1 AND state <> $2")
        .bind(worker_id)
        .bind(SandboxState::Stopped)
        .fetch_all(connection)
        .await
}

/// Teams with live (running or paused) sandboxes.
pub async fn teams_running(
    connection: impl sqlx::PgExecutor<'_>,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar("SELECT DISTINCT team_id FROM sandboxes WHERE state IN ($1, $2)")
        .bind(SandboxState::Running)
        .bind(SandboxState::Paused)
        .fetch_all(connection)
        .await
}

/// Where a team's sandbox is: its state, why it stopped, and its worker.
#[derive(sqlx::FromRow)]
pub struct Whereabouts {
    pub state: SandboxState,
    pub stop_reason: Option<StopReason>,
    pub worker_id: Option<String>,
}

pub async fn whereabouts(
    connection: impl sqlx::PgExecutor<'_>,
    team_id: Uuid,
    id: Uuid,
) -> Result<Option<Whereabouts>, sqlx::Error> {
    sqlx::query_as(
        "SELECT state, stop_reason, worker_id FROM sandboxes WHERE id = $1 AND team_id = $2",
    )
    .bind(id)
    .bind(team_id)
    .fetch_optional(connection)
    .await
}

/// Locks a sandbox of `team_id` for a pause or resume until the caller's transaction ends.
pub async fn lock_for_pause(
    connection: &mut PgConnection,
    team_id: Uuid,
    id: Uuid,
) -> Result<Option<Whereabouts>, sqlx::Error> {
    sqlx::query_as(
        "SELECT state, stop_reason, worker_id FROM sandboxes \
         WHERE id = $1 AND team_id = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(team_id)
    .fetch_optional(connection)
    .await
}

/// A live sandbox was paused (`paused`) or resumed on its worker.
pub async fn set_paused(
    connection: &mut PgConnection,
    id: Uuid,
    paused: bool,
) -> Result<SandboxRow, sqlx::Error> {
    let (to, from) = if paused {
        (SandboxState::Paused, SandboxState::Running)
    } else {
        (SandboxState::Running, SandboxState::Paused)
    };
    sqlx::query_as(&format!(
        "UPDATE sandboxes SET state = $2 WHERE id = $1 AND state IN ($2, $3) \
         RETURNING {SANDBOX_COLUMNS}"
    ))
    .bind(id)
    .bind(to)
    .bind(from)
    .fetch_one(connection)
    .await
}

/// Follows what a worker's heartbeat says of the sandboxes that pause by themselves when
/// idle: those it lists as paused are `paused`, its others `running`. (A pause the gateway
/// asked for is written when it is made.)
pub async fn follow_idle_pauses(
    connection: impl sqlx::PgExecutor<'_>,
    worker_id: &str,
    paused: &[Uuid],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE sandboxes SET state = CASE WHEN id = ANY($2) THEN $3 ELSE $4 END \
         WHERE worker_id = $1 AND auto_pause_secs IS NOT NULL AND state IN ($3, $4) \
           AND state <> CASE WHEN id = ANY($2) THEN $3 ELSE $4 END",
    )
    .bind(worker_id)
    .bind(paused)
    .bind(SandboxState::Paused)
    .bind(SandboxState::Running)
    .execute(connection)
    .await?;
    Ok(())
}
