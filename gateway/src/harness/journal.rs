//! Writes of a stepped run's journal: each in one transaction that first locks the run's
//! row and checks the lease epoch, so a former owner (paused past its lease, then resumed)
//! cannot write a step, an event or a message once another gateway adopted the run. Events
//! are numbered from the row's `last_seq` under that lock: without gaps, each once.

use sandbase_api::conversation::{Message, Usage};
use serde_json::Value;
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use super::lifecycle::Claim;

/// Why a journal write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Another gateway holds the run now (its epoch is newer), or the local lease ran out.
    #[error("the lease of this run was lost")]
    LeaseLost,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// One write: the run's row locked, its counters read.
pub struct Write {
    pub tx: Transaction<'static, Postgres>,
    pub run_id: Uuid,
    pub turn: i32,
    last_seq: i64,
    last_step: i32,
    first_seq: i64,
    tool_calls: i32,
    usage: Option<(Usage, i64)>,
}

/// Opens a write for `claim`: refused when the run's epoch is no longer the claim's.
pub async fn begin(db: &PgPool, claim: Claim) -> Result<Write, JournalError> {
    let mut tx = db.begin().await?;
    let row: Option<(i64, i64, i32, i32)> = sqlx::query_as(
        "SELECT lease_epoch, last_seq, last_step, turns FROM agent_runs WHERE id = $1 FOR UPDATE",
    )
    .bind(claim.run_id)
    .fetch_optional(&mut *tx)
    .await?;
    match row {
        Some((epoch, last_seq, last_step, turn)) if epoch == claim.epoch => Ok(Write {
            tx,
            run_id: claim.run_id,
            turn,
            last_seq,
            last_step,
            first_seq: last_seq,
            tool_calls: 0,
            usage: None,
        }),
        _ => Err(JournalError::LeaseLost),
    }
}

impl Write {
    /// Opens a write of a run no gateway holds (a waiting run, from a request).
    pub async fn unleased(db: &PgPool, run_id: Uuid) -> Result<Write, sqlx::Error> {
        Write::within(db.begin().await?, run_id).await
    }

    /// Opens a write in a transaction already begun (the one that made the run: its first
    /// turn is written with it, so no gateway sees the run without its input).
    pub async fn within(
        mut tx: Transaction<'static, Postgres>,
        run_id: Uuid,
    ) -> Result<Write, sqlx::Error> {
        let (last_seq, last_step, turn): (i64, i32, i32) = sqlx::query_as(
            "SELECT last_seq, last_step, turns FROM agent_runs WHERE id = $1 FOR UPDATE",
        )
        .bind(run_id)
        .fetch_one(&mut *tx)
        .await?;
        Ok(Write {
            tx,
            run_id,
            turn,
            last_seq,
            last_step,
            first_seq: last_seq,
            tool_calls: 0,
            usage: None,
        })
    }

    /// Appends an event; its `seq`.
    pub async fn event(&mut self, kind: &str, data: Value) -> Result<i64, sqlx::Error> {
        self.last_seq += 1;
        sqlx::query(
            "INSERT INTO agent_run_events (run_id, seq, turn, type, data) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(self.run_id)
        .bind(self.last_seq)
        .bind(self.turn)
        .bind(kind)
        .bind(&data)
        .execute(&mut *self.tx)
        .await?;
        Ok(self.last_seq)
    }

    /// Writes a step `intended` (before its side effect); its number.
    pub async fn intend(
        &mut self,
        kind: &str,
        name: &str,
        call_id: Option<&str>,
        args: &Value,
        epoch: i64,
    ) -> Result<i32, sqlx::Error> {
        self.last_step += 1;
        sqlx::query(
            "INSERT INTO agent_run_steps (run_id, seq, turn, kind, step_state, call_id, name, args, epoch) \
             VALUES ($1, $2, $3, $4, $9, $5, $6, $7, $8)",
        )
        .bind(self.run_id)
        .bind(self.last_step)
        .bind(self.turn)
        .bind(kind)
        .bind(call_id)
        .bind(name)
        .bind(args)
        .bind(epoch)
        .bind("intended")
        .execute(&mut *self.tx)
        .await?;
        if kind == "tool" {
            self.tool_calls += 1;
        }
        Ok(self.last_step)
    }

    /// Ends step `seq` (`completed`, `failed` or `interrupted`) with what it gave.
    pub async fn finish_step(
        &mut self,
        seq: i32,
        state: &str,
        result: &Value,
        cost_micro: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE agent_run_steps SET step_state = $3, result = $4, cost_micro = $5, finished_at = now() \
             WHERE run_id = $1 AND seq = $2",
        )
        .bind(self.run_id)
        .bind(seq)
        .bind(state)
        .bind(result)
        .bind(cost_micro)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Appends a message to the conversation.
    pub async fn message(&mut self, message: &Message) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO agent_run_items (run_id, seq, turn, message) \
             SELECT $1, coalesce(max(seq), 0) + 1, $2, $3 FROM agent_run_items WHERE run_id = $1",
        )
        .bind(self.run_id)
        .bind(self.turn)
        .bind(sqlx::types::Json(message))
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Begins a new turn (the next events and messages are its).
    pub fn next_turn(&mut self) {
        self.turn += 1;
    }

    /// Adds a model call's tokens and cost to the run's.
    pub fn spent(&mut self, usage: Usage, cost_micro: i64) {
        self.usage = Some((usage, cost_micro));
    }

    /// Commits, with the run's counters; answers whether events were written.
    pub async fn commit(mut self) -> Result<bool, sqlx::Error> {
        let (usage, cost) = self.usage.unwrap_or_default();
        sqlx::query(
            "UPDATE agent_runs SET last_seq = $2, last_step = $3, turns = $4, \
                 tool_calls = tool_calls + $5, cost_micro = cost_micro + $6, updated_at = now(), \
                 usage = jsonb_build_object( \
                   'input_tokens', coalesce((usage->>'input_tokens')::bigint, 0) + $7, \
                   'cached_input_tokens', coalesce((usage->>'cached_input_tokens')::bigint, 0) + $8, \
                   'cache_write_tokens', coalesce((usage->>'cache_write_tokens')::bigint, 0) + $9, \
                   'output_tokens', coalesce((usage->>'output_tokens')::bigint, 0) + $10) \
             WHERE id = $1",
        )
        .bind(self.run_id)
        .bind(self.last_seq)
        .bind(self.last_step)
        .bind(self.turn)
        .bind(self.tool_calls)
        .bind(cost)
        .bind(usage.input_tokens as i64)
        .bind(usage.cached_input_tokens as i64)
        .bind(usage.cache_write_tokens as i64)
        .bind(usage.output_tokens as i64)
        .execute(&mut *self.tx)
        .await?;
        let wrote_events = self.last_seq > self.first_seq;
        self.tx.commit().await?;
        Ok(wrote_events)
    }
}
