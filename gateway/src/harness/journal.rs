//! Writes of a stepped run's journal. What a write adds (steps, their ends, events,
//! messages) is kept until its commit and written then in one statement with the run's
//! counters, which locks the run's row and checks the lease epoch, so a former owner (paused
//! past its lease, then resumed) cannot write a step, an event or a message once another
//! gateway adopted the run. Events are numbered in that statement from the row's `last_seq`
//! under its lock: without gaps, each once, whoever else writes events meanwhile.
//!
//! Two kinds of write: a [`Quick`] one, the lease holder's steps and pieces, is that one
//! statement alone — the holder numbers steps and turns from what its last write left
//! (nobody else changes them while it holds the lease; the statement checks they did not
//! move) — and a [`Write`], in a transaction that locks the row first, for writes that do
//! more in the same transaction or come from a request. The lease holder's writes take
//! turns (parallel tool calls write one after the other), as the row's lock made them.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use sandbase_api::conversation::{Message, Usage};
use serde_json::Value;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::OwnedMutexGuard;
use uuid::Uuid;

use super::lease::Lease;

/// Why a journal write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Another gateway holds the run now (its epoch is newer), or the local lease ran out.
    #[error("the lease of this run was lost")]
    LeaseLost,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// What a write adds, and the counters it numbers steps and turns from.
pub struct Buffer {
    pub run_id: Uuid,
    pub turn: i32,
    last_step: i32,
    /// The (last step, turn) the write started from: the statement checks the row has them.
    from: (i32, i32),
    tool_calls: i32,
    usage: Option<(Usage, i64)>,
    added: Added,
}

/// What a write adds, column by column, written at its commit.
#[derive(Default)]
struct Added {
    step_seq: Vec<i32>,
    step_turn: Vec<i32>,
    step_kind: Vec<String>,
    step_call_id: Vec<Option<String>>,
    step_name: Vec<String>,
    step_args: Vec<Value>,
    step_epoch: Vec<i64>,
    end_seq: Vec<i32>,
    end_state: Vec<String>,
    end_result: Vec<Value>,
    end_cost: Vec<i64>,
    event_turn: Vec<i32>,
    event_kind: Vec<String>,
    event_data: Vec<Value>,
    item_turn: Vec<i32>,
    item_message: Vec<Value>,
}

impl Buffer {
    fn new(run_id: Uuid, (last_step, turn): (i32, i32)) -> Buffer {
        Buffer {
            run_id,
            turn,
            last_step,
            from: (last_step, turn),
            tool_calls: 0,
            usage: None,
            added: Added::default(),
        }
    }

    /// The run's (last step, turn) once this write is committed.
    fn counters(&self) -> (i32, i32) {
        (self.last_step, self.turn)
    }

    /// Appends an event (numbered at the commit).
    pub async fn event(&mut self, kind: &str, data: Value) -> Result<(), sqlx::Error> {
        let added = &mut self.added;
        added.event_turn.push(self.turn);
        added.event_kind.push(kind.to_owned());
        added.event_data.push(data);
        Ok(())
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
        let added = &mut self.added;
        added.step_seq.push(self.last_step);
        added.step_turn.push(self.turn);
        added.step_kind.push(kind.to_owned());
        added.step_call_id.push(call_id.map(str::to_owned));
        added.step_name.push(name.to_owned());
        added.step_args.push(args.clone());
        added.step_epoch.push(epoch);
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
        let added = &mut self.added;
        added.end_seq.push(seq);
        added.end_state.push(state.to_owned());
        added.end_result.push(result.clone());
        added.end_cost.push(cost_micro);
        Ok(())
    }

    /// Appends a message to the conversation.
    pub async fn message(&mut self, message: &Message) -> Result<(), sqlx::Error> {
        let message =
            serde_json::to_value(message).map_err(|error| sqlx::Error::Encode(Box::new(error)))?;
        self.added.item_turn.push(self.turn);
        self.added.item_message.push(message);
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

    /// Writes what was added, with the run's counters, in one statement (`epoch`: refused
    /// unless the run's lease has it), checking the row still has the counters the write
    /// started from; whether it was written.
    async fn write<'c, E>(
        self,
        executor: E,
        epoch: Option<i64>,
        lazy: bool,
    ) -> Result<bool, sqlx::Error>
    where
        E: sqlx::Executor<'c, Database = Postgres>,
    {
        let (usage, cost) = self.usage.unwrap_or_default();
        let added = self.added;
        let written: Option<(i64,)> = sqlx::query_as(COMMIT)
            .bind(self.run_id)
            .bind(self.last_step)
            .bind(self.turn)
            .bind(self.tool_calls)
            .bind(cost)
            .bind(usage.input_tokens as i64)
            .bind(usage.cached_input_tokens as i64)
            .bind(usage.cache_write_tokens as i64)
            .bind(usage.output_tokens as i64)
            .bind(added.step_seq)
            .bind(added.step_turn)
            .bind(added.step_kind)
            .bind(added.step_call_id)
            .bind(added.step_name)
            .bind(added.step_args)
            .bind(added.step_epoch)
            .bind(added.end_seq)
            .bind(added.end_state)
            .bind(added.end_result)
            .bind(added.end_cost)
            .bind(added.event_turn)
            .bind(added.event_kind)
            .bind(added.event_data)
            .bind(added.item_turn)
            .bind(added.item_message)
            .bind(epoch)
            .bind(self.from.0)
            .bind(self.from.1)
            .bind(lazy)
            .fetch_optional(executor)
            .await?;
        Ok(written.is_some())
    }

    fn has_events(&self) -> bool {
        !self.added.event_kind.is_empty()
    }
}

/// A write in a transaction that locked the run's row first (`tx`, for what else the
/// caller does under that lock).
pub struct Write {
    pub tx: Transaction<'static, Postgres>,
    buffer: Buffer,
    /// The lease the write is its holder's, and its turn to write.
    lease: Option<(Arc<Lease>, OwnedMutexGuard<()>)>,
}

impl Deref for Write {
    type Target = Buffer;
    fn deref(&self) -> &Buffer {
        &self.buffer
    }
}

impl DerefMut for Write {
    fn deref_mut(&mut self) -> &mut Buffer {
        &mut self.buffer
    }
}

/// Opens a write for the run `lease` holds: refused when the run's epoch is no longer the
/// lease's.
pub async fn begin(db: &PgPool, lease: &Arc<Lease>) -> Result<Write, JournalError> {
    let queue = lease.writing().await;
    let mut tx = db.begin().await?;
    let row: Option<(i64, i32, i32)> = sqlx::query_as(
        "SELECT lease_epoch, last_step, turns FROM agent_runs WHERE id = $1 FOR UPDATE",
    )
    .bind(lease.claim.run_id)
    .fetch_optional(&mut *tx)
    .await?;
    match row {
        Some((epoch, last_step, turn)) if epoch == lease.claim.epoch => Ok(Write {
            tx,
            buffer: Buffer::new(lease.claim.run_id, (last_step, turn)),
            lease: Some((lease.clone(), queue)),
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
        let counters: (i32, i32) =
            sqlx::query_as("SELECT last_step, turns FROM agent_runs WHERE id = $1 FOR UPDATE")
                .bind(run_id)
                .fetch_one(&mut *tx)
                .await?;
        Ok(Write {
            tx,
            buffer: Buffer::new(run_id, counters),
            lease: None,
        })
    }

    /// Commits what the write added, with the run's counters; whether events were written.
    /// A step begun and ended in the same write is written ended.
    pub async fn commit(self) -> Result<bool, sqlx::Error> {
        let Write {
            mut tx,
            buffer,
            lease,
        } = self;
        let events = buffer.has_events();
        let counters = buffer.counters();
        if !buffer.write(&mut *tx, None, false).await? {
            // The row is locked by this transaction since it read the counters: not reached.
            return Err(sqlx::Error::RowNotFound);
        }
        tx.commit().await?;
        if let Some((lease, _queue)) = lease {
            lease.remember(Some(counters));
        }
        Ok(events)
    }
}

/// The lease holder's write: one statement, no transaction around it.
pub struct Quick {
    buffer: Buffer,
    lease: Arc<Lease>,
    /// Its turn to write: the counters stay as read until its commit.
    _queue: OwnedMutexGuard<()>,
    lazy: bool,
}

impl Deref for Quick {
    type Target = Buffer;
    fn deref(&self) -> &Buffer {
        &self.buffer
    }
}

impl DerefMut for Quick {
    fn deref_mut(&mut self) -> &mut Buffer {
        &mut self.buffer
    }
}

/// Opens a quick write for the run `lease` holds, numbering from what its last write left
/// (read, once, when no write of this lease was made yet).
pub async fn quick(db: &PgPool, lease: &Arc<Lease>) -> Result<Quick, JournalError> {
    let queue = lease.writing().await;
    let counters = match lease.counters() {
        Some(counters) => counters,
        None => sqlx::query_as(
            "SELECT last_step, turns FROM agent_runs WHERE id = $1 AND lease_epoch = $2",
        )
        .bind(lease.claim.run_id)
        .bind(lease.claim.epoch)
        .fetch_optional(db)
        .await?
        .ok_or(JournalError::LeaseLost)?,
    };
    Ok(Quick {
        buffer: Buffer::new(lease.claim.run_id, counters),
        lease: lease.clone(),
        _queue: queue,
        lazy: false,
    })
}

impl Quick {
    /// Commits without waiting for the disk (pieces of a streamed answer: were the database
    /// to lose them in a crash, it would lose every later write with them — its log is one
    /// sequence — so the journal has no gap; the next synchronous write flushes them).
    pub fn lazily(mut self) -> Quick {
        self.lazy = true;
        self
    }

    /// Commits what the write added; whether events were written. Refused when the lease
    /// is no longer this gateway's or the counters moved.
    pub async fn commit(self, db: &PgPool) -> Result<bool, JournalError> {
        let events = self.buffer.has_events();
        let counters = self.buffer.counters();
        let epoch = Some(self.lease.claim.epoch);
        if self.buffer.write(db, epoch, self.lazy).await? {
            self.lease.remember(Some(counters));
            Ok(events)
        } else {
            self.lease.remember(None);
            Err(JournalError::LeaseLost)
        }
    }
}

/// The one statement of a commit: the run's row updated first (locked, its epoch and
/// counters checked; none of the rest happens when they do not match), the steps begun
/// (ended already when their end is in the same write), the ends of steps begun before, the
/// events (numbered after the row's `last_seq`), the messages (numbered after the
/// conversation's last), and, for a lazy write, its commit not waiting for the disk.
const COMMIT: &str = "\
WITH run AS ( \
    UPDATE agent_runs SET last_seq = last_seq + cardinality($22::text[]), last_step = $2, \
        turns = $3, tool_calls = tool_calls + $4, cost_micro = cost_micro + $5, \
        updated_at = now(), \
        usage = jsonb_build_object( \
          'input_tokens', coalesce((usage->>'input_tokens')::bigint, 0) + $6, \
          'cached_input_tokens', coalesce((usage->>'cached_input_tokens')::bigint, 0) + $7, \
          'cache_write_tokens', coalesce((usage->>'cache_write_tokens')::bigint, 0) + $8, \
          'output_tokens', coalesce((usage->>'output_tokens')::bigint, 0) + $9) \
    WHERE id = $1 AND lease_epoch = coalesce($26::bigint, lease_epoch) \
      AND last_step = $27 AND turns = $28 \
    RETURNING last_seq - cardinality($22::text[]) AS base \
), ends AS ( \
    SELECT * FROM unnest($17::int[], $18::text[], $19::jsonb[], $20::bigint[]) \
        AS e(seq, state, result, cost) \
), begun AS ( \
    INSERT INTO agent_run_steps (run_id, seq, turn, kind, step_state, call_id, name, args, epoch, \
                                 result, cost_micro, finished_at) \
    SELECT $1, s.seq, s.turn, s.kind, coalesce(e.state, 'intended'), s.call_id, s.name, s.args, \
           s.epoch, e.result, coalesce(e.cost, 0), CASE WHEN e.seq IS NULL THEN NULL ELSE now() END \
    FROM run, unnest($10::int[], $11::int[], $12::text[], $13::text[], $14::text[], \
                     $15::jsonb[], $16::bigint[]) AS s(seq, turn, kind, call_id, name, args, epoch) \
    LEFT JOIN ends e ON e.seq = s.seq \
), ended AS ( \
    UPDATE agent_run_steps t SET step_state = e.state, result = e.result, cost_micro = e.cost, \
                                 finished_at = now() \
    FROM run, ends e WHERE t.run_id = $1 AND t.seq = e.seq AND e.seq <> ALL($10::int[]) \
), events AS ( \
    INSERT INTO agent_run_events (run_id, seq, turn, type, data) \
    SELECT $1, run.base + v.n, v.turn, v.type, v.data \
    FROM run, unnest($21::int[], $22::text[], $23::jsonb[]) WITH ORDINALITY AS v(turn, type, data, n) \
), items AS ( \
    INSERT INTO agent_run_items (run_id, seq, turn, message) \
    SELECT $1, last.seq + i.n, i.turn, i.message \
    FROM run, (SELECT coalesce(max(seq), 0) AS seq FROM agent_run_items WHERE run_id = $1) last, \
         unnest($24::int[], $25::jsonb[]) WITH ORDINALITY AS i(turn, message, n) \
), lazy AS ( \
    SELECT set_config('synchronous_commit', \
        CASE WHEN $29 THEN 'off' ELSE current_setting('synchronous_commit') END, true) AS value \
) \
SELECT run.base FROM run, lazy";
