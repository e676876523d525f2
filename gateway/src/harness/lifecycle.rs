//! Where an agent run stands, and every change of it: the only module that writes `status`.
//! A run is `queued` when made; a gateway's claim makes it `running`; a turn that ends leaves
//! it `idle`, a client function `requires_action` (neither holds a lease: they are rows);
//! a message or result makes it `running` again; it ends `completed`, `failed`, `cancelled`
//! or `limited`, and then its key is revoked.

use sandbase_api::agent_runs::AgentRunStatus;
use serde_json::{Value, json};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::text_enum::text_enum;

text_enum! {
    /// The `status` column.
    pub enum Status {
        Queued => "queued",
        Running => "running",
        RequiresAction => "requires_action",
        Idle => "idle",
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
        Limited => "limited",
    }
}

impl Status {
    pub fn to_api(self) -> AgentRunStatus {
        match self {
            Status::Queued => AgentRunStatus::Queued,
            Status::Running => AgentRunStatus::Running,
            Status::RequiresAction => AgentRunStatus::RequiresAction,
            Status::Idle => AgentRunStatus::Idle,
            Status::Completed => AgentRunStatus::Completed,
            Status::Failed => AgentRunStatus::Failed,
            Status::Cancelled => AgentRunStatus::Cancelled,
            Status::Limited => AgentRunStatus::Limited,
        }
    }

    pub fn is_final(self) -> bool {
        self.to_api().is_final()
    }

    /// The run is not being stepped: it waits for its client, or it ended.
    pub fn has_stopped(self) -> bool {
        matches!(self, Status::Idle | Status::RequiresAction) || self.is_final()
    }
}

/// A run a gateway claimed: its id and the epoch of this claim.
#[derive(Debug, Clone, Copy)]
pub struct Claim {
    pub run_id: Uuid,
    pub epoch: i64,
}

/// Claims one run some gateway must step (queued, or running with its lease missing or run
/// out): leased to `owner` for `lease_secs` under a new epoch, `running`.
pub async fn claim(
    connection: &mut PgConnection,
    owner: &str,
    lease_secs: u64,
) -> Result<Option<Claim>, sqlx::Error> {
    let claimed: Option<(Uuid, i64)> = sqlx::query_as(
        "UPDATE agent_runs SET lease_owner = $1, \
             lease_until = now() + make_interval(secs => $2), lease_epoch = lease_epoch + 1, \
             status = 'running', started_at = coalesce(started_at, now()), updated_at = now() \
         WHERE id = (SELECT id FROM agent_runs \
                     WHERE status IN ('queued', 'running') \
                       AND (lease_until IS NULL OR lease_until < now()) \
                     ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) \
         RETURNING id, lease_epoch",
    )
    .bind(owner)
    .bind(lease_secs as f64)
    .fetch_optional(connection)
    .await?;
    Ok(claimed.map(|(run_id, epoch)| Claim { run_id, epoch }))
}

/// Renews `claim`'s lease; false when the run is no longer this claim's (another gateway
/// adopted it, or it stopped being stepped).
pub async fn renew(
    connection: &mut PgConnection,
    claim: Claim,
    lease_secs: u64,
) -> Result<bool, sqlx::Error> {
    let renewed = sqlx::query(
        "UPDATE agent_runs SET lease_until = now() + make_interval(secs => $3) \
         WHERE id = $1 AND lease_epoch = $2 AND status = 'running'",
    )
    .bind(claim.run_id)
    .bind(claim.epoch)
    .bind(lease_secs as f64)
    .execute(connection)
    .await?;
    Ok(renewed.rows_affected() == 1)
}

/// Sets a stepped run's status to one that holds no lease (`idle`, `requires_action`, or a
/// final one), within the caller's epoch-checked transaction; a final status revokes the
/// run's key. Answers the event to write (`run.status`) and the public id of the key it
/// revoked (for the gateways' key caches).
pub async fn settle(
    connection: &mut PgConnection,
    run_id: Uuid,
    status: Status,
    error: Option<Value>,
    required_actions: Value,
) -> Result<(Value, Option<String>), sqlx::Error> {
    sqlx::query(
        "UPDATE agent_runs SET status = $2, error = $3, required_actions = $4, \
             lease_owner = NULL, lease_until = NULL, cancel_scope = NULL, updated_at = now(), \
             finished_at = CASE WHEN $5 THEN now() ELSE finished_at END \
         WHERE id = $1",
    )
    .bind(run_id)
    .bind(status)
    .bind(&error)
    .bind(&required_actions)
    .bind(status.is_final())
    .execute(&mut *connection)
    .await?;
    let revoked = if status.is_final() {
        revoke_run_key(connection, run_id).await?
    } else {
        None
    };
    Ok((
        json!({ "status": status.as_str(), "error": error }),
        revoked,
    ))
}

/// Revokes the run's own key (and so whatever still acts with it); its public id.
async fn revoke_run_key(
    connection: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE api_keys SET revoked_at = now() WHERE revoked_at IS NULL \
           AND id = (SELECT run_key_id FROM agent_runs WHERE id = $1) RETURNING public_id",
    )
    .bind(run_id)
    .fetch_optional(connection)
    .await
}

/// Makes a waiting run (`idle`, `requires_action`) one a gateway steps again (`running`,
/// no lease: the next claim takes it).
pub async fn resume(connection: &mut PgConnection, run_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE agent_runs SET status = 'running', lease_owner = NULL, lease_until = NULL, \
             updated_at = now() \
         WHERE id = $1 AND status IN ('idle', 'requires_action')",
    )
    .bind(run_id)
    .execute(connection)
    .await?;
    Ok(())
}

/// The runs idle past their `idle_timeout_secs`, made `running` with a `run` cancel asked
/// for, so that a gateway ends them (`completed`) and destroys their sandbox.
pub async fn expire_idle(connection: &mut PgConnection) -> Result<u64, sqlx::Error> {
    let expired = sqlx::query(
        "UPDATE agent_runs SET status = 'running', cancel_scope = 'idle', lease_owner = NULL, \
             lease_until = NULL, updated_at = now() \
         WHERE status = 'idle' AND updated_at + make_interval(secs => idle_timeout_secs) < now()",
    )
    .execute(connection)
    .await?;
    Ok(expired.rows_affected())
}

/// The runs whose key was revoked (their creator's key revoked, say) and that have not
/// ended: made `running` with a `revoked` cancel, so that a gateway ends them (`failed`,
/// `key_revoked`) within a second or, when one steps them, at its next step.
pub async fn expire_revoked(connection: &mut PgConnection) -> Result<u64, sqlx::Error> {
    let expired = sqlx::query(
        "UPDATE agent_runs r SET cancel_scope = 'revoked', updated_at = now(), \
             status = CASE WHEN r.status IN ('idle', 'requires_action') THEN 'running' \
                           ELSE r.status END, \
             lease_until = CASE WHEN r.status IN ('idle', 'requires_action') THEN NULL \
                                ELSE r.lease_until END \
         FROM api_keys k \
         WHERE k.id = r.run_key_id AND k.revoked_at IS NOT NULL \
           AND r.status IN ('queued', 'running', 'idle', 'requires_action') \
           AND r.cancel_scope IS DISTINCT FROM 'revoked'",
    )
    .execute(connection)
    .await?;
    Ok(expired.rows_affected())
}

/// Asks for a cancel of `scope` (`turn`, `run`, `tool:CALL_ID`); a waiting run is made one a
/// gateway steps, so that it is carried out (its sandbox destroyed) at once. Nothing to do
/// for a turn of a run that is idle already, nor for a call of a run that is not running:
/// false then.
pub async fn ask_cancel(
    connection: &mut PgConnection,
    run_id: Uuid,
    scope: &str,
) -> Result<bool, sqlx::Error> {
    let asked = sqlx::query(
        "UPDATE agent_runs SET cancel_scope = $2, updated_at = now(), \
             status = CASE WHEN status IN ('idle', 'requires_action') THEN 'running' ELSE status END, \
             lease_until = CASE WHEN status IN ('idle', 'requires_action') THEN NULL ELSE lease_until END \
         WHERE id = $1 AND NOT ($2 = 'turn' AND status = 'idle') \
           AND NOT ($2 LIKE 'tool:%' AND status <> 'running')",
    )
    .bind(run_id)
    .bind(scope)
    .execute(connection)
    .await?;
    Ok(asked.rows_affected() == 1)
}

/// Clears a carried-out cancel of one tool call (`tool:CALL_ID`).
pub async fn tool_cancel_done(
    connection: &mut PgConnection,
    run_id: Uuid,
    scope: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE agent_runs SET cancel_scope = NULL WHERE id = $1 AND cancel_scope = $2")
        .bind(run_id)
        .bind(scope)
        .execute(connection)
        .await?;
    Ok(())
}
