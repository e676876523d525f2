//! Every change of a run's state happens here: `queued` when submitted, `running` once a
//! dispatcher claimed it (with a lease it renews), back to `queued` when no worker had room,
//! and `completed` or `failed` at the end.

use std::collections::BTreeMap;

use sandbase_api::sandboxes::{EgressPolicy, ExecResult};
use sqlx::PgConnection;
use uuid::Uuid;

pub use super::row::RunState;
use super::row::{RUN_COLUMNS, RunRow};

/// How long a claimed run's lease lasts; renewed while it runs.
pub const LEASE_SECS: f64 = 30.0;

/// What a new run's row holds.
pub struct NewRun<'a> {
    pub id: Uuid,
    pub owner: crate::sandboxes::Owner,
    pub sandbox: &'a crate::sandboxes::NewSandbox,
    pub argv: &'a [String],
    pub outputs: &'a str,
    pub timeout_secs: u64,
    /// The size of its inputs in the store, when it has some.
    pub inputs_size: Option<usize>,
}

/// A submitted run: `queued`.
pub async fn insert_queued(
    connection: &mut PgConnection,
    new: NewRun<'_>,
) -> Result<RunRow, sqlx::Error> {
    let sandbox = new.sandbox;
    let resources = sandbox.resources;
    sqlx::query_as(&format!(
        "INSERT INTO runs (id, team_id, api_key_id, user_id, template, argv, env, outputs, timeout_secs, \
           cpu_millis, memory_mb, disk_mb, pids, has_inputs, egress, credentials, state, inputs_size, \
           isolation, store) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20) \
         RETURNING {RUN_COLUMNS}"
    ))
    .bind(new.id)
    .bind(new.owner.team_id)
    .bind(new.owner.api_key_id)
    .bind(new.owner.user_id)
    .bind(sandbox.template.as_str())
    .bind(sqlx::types::Json(new.argv))
    .bind(sqlx::types::Json(&sandbox.env))
    .bind(new.outputs)
    .bind(new.timeout_secs as i32)
    .bind(resources.cpu_millis as i32)
    .bind(resources.memory_mb as i32)
    .bind(resources.disk_mb as i32)
    .bind(resources.pids as i32)
    .bind(new.inputs_size.is_some())
    .bind(sandbox.egress.as_ref().map(sqlx::types::Json))
    .bind(&sandbox.credentials)
    .bind(RunState::Queued)
    .bind(new.inputs_size.map(|size| size as i64))
    .bind(sandbox.isolation.as_str())
    .bind(sandbox.store)
    .fetch_one(connection)
    .await
}

/// A run a dispatcher claimed: what it needs to carry it out.
#[derive(sqlx::FromRow)]
pub struct Claimed {
    pub team_id: Uuid,
    pub api_key_id: Option<Uuid>,
    pub user_id: Option<Uuid>,
    pub template: String,
    pub argv: sqlx::types::Json<Vec<String>>,
    pub env: sqlx::types::Json<BTreeMap<String, String>>,
    pub outputs: String,
    pub timeout_secs: i32,
    pub cpu_millis: i32,
    pub memory_mb: i32,
    pub disk_mb: i32,
    pub pids: i32,
    pub has_inputs: bool,
    pub egress: Option<sqlx::types::Json<EgressPolicy>>,
    pub credentials: Vec<String>,
    pub isolation: String,
    pub store: bool,
}

/// `queued` → `running` with a lease; `None` when another gateway took it (or it is no
/// longer queued).
pub async fn claim(
    connection: &mut PgConnection,
    run: Uuid,
) -> Result<Option<Claimed>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE runs SET state = $3, started_at = now(), lease_until = now() + make_interval(secs => $2) \
         WHERE id = $1 AND state = $4 \
         RETURNING team_id, api_key_id, user_id, template, argv, env, outputs, timeout_secs, \
                   cpu_millis, memory_mb, disk_mb, pids, has_inputs, egress, credentials, isolation, \
                   store",
    )
    .bind(run)
    .bind(LEASE_SECS)
    .bind(RunState::Running)
    .bind(RunState::Queued)
    .fetch_optional(connection)
    .await
}

/// Extends a running run's lease.
pub async fn renew_lease(connection: &mut PgConnection, run: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE runs SET lease_until = now() + make_interval(secs => $2) WHERE id = $1 AND state = $3",
    )
    .bind(run)
    .bind(LEASE_SECS)
    .bind(RunState::Running)
    .execute(connection)
    .await
    .map(drop)
}

/// Notes the sandbox a running run was given.
pub async fn set_sandbox(
    connection: &mut PgConnection,
    run: Uuid,
    sandbox: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE runs SET sandbox_id = $2 WHERE id = $1")
        .bind(run)
        .bind(sandbox)
        .execute(connection)
        .await
        .map(drop)
}

/// `running` → `completed`, with the command's result.
pub async fn complete(
    connection: &mut PgConnection,
    run: Uuid,
    exec: &ExecResult,
    kept_stdout: &str,
    kept_stderr: &str,
    artifact_size: Option<u64>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE runs SET state = $7, exit_code = $2, timed_out = $3, stdout = $4, \
         stderr = $5, artifact_size = $6, finished_at = now(), lease_until = NULL WHERE id = $1",
    )
    .bind(run)
    .bind(exec.exit_code)
    .bind(exec.timed_out)
    .bind(kept_stdout)
    .bind(kept_stderr)
    .bind(artifact_size.map(|size| size as i64))
    .bind(RunState::Completed)
    .execute(connection)
    .await
    .map(drop)
}

/// `running` → `queued` again: no worker had room.
pub async fn requeue(connection: &mut PgConnection, run: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE runs SET state = $2, started_at = NULL, lease_until = NULL WHERE id = $1")
        .bind(run)
        .bind(RunState::Queued)
        .execute(connection)
        .await
        .map(drop)
}

/// `running` → `failed`, saying why.
pub async fn fail(
    connection: &mut PgConnection,
    run: Uuid,
    error: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE runs SET state = $3, error = $2, finished_at = now(), lease_until = NULL WHERE id = $1",
    )
    .bind(run)
    .bind(error)
    .bind(RunState::Failed)
    .execute(connection)
    .await
    .map(drop)
}

/// Runs whose gateway stopped renewing their lease failed; returns their sandboxes.
pub async fn fail_abandoned(connection: &mut PgConnection) -> Result<Vec<Uuid>, sqlx::Error> {
    let abandoned: Vec<Option<Uuid>> = sqlx::query_scalar(
        "UPDATE runs SET state = $2, error = $1, finished_at = now(), lease_until = NULL \
         WHERE state = $3 AND lease_until < now() RETURNING sandbox_id",
    )
    .bind("the gateway carrying out this run stopped")
    .bind(RunState::Failed)
    .bind(RunState::Running)
    .fetch_all(connection)
    .await?;
    Ok(abandoned.into_iter().flatten().collect())
}

/// Queued runs that waited longer than `secs` fail (their inputs are past the retention);
/// returns their teams, ids and whether they had inputs.
pub async fn fail_stale_queued(
    connection: &mut PgConnection,
    secs: f64,
) -> Result<Vec<(Uuid, Uuid, bool)>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE runs SET state = $2, error = $1, finished_at = now(), inputs_size = NULL \
         WHERE state = $3 AND created_at < now() - make_interval(secs => $4) \
         RETURNING team_id, id, has_inputs",
    )
    .bind("the run waited in the queue longer than runs.artifact_retention_secs")
    .bind(RunState::Failed)
    .bind(RunState::Queued)
    .bind(secs)
    .fetch_all(connection)
    .await
}

/// Queued runs older than a few seconds (to check they are in Redis).
pub async fn queued_a_while(
    connection: &mut PgConnection,
) -> Result<Vec<(Uuid, Uuid)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, team_id FROM runs WHERE state = $1 AND created_at < now() - interval '5 seconds' \
         ORDER BY created_at LIMIT 1000",
    )
    .bind(RunState::Queued)
    .fetch_all(connection)
    .await
}
