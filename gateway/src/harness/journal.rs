//! Writes of a stepped run's journal: each in one transaction that first locks the run's
//! row and checks the lease epoch, so a former owner (paused past its lease, then resumed)
//! cannot write a step, an event or a message once another gateway adopted the run. Events
//! are numbered from the row's `last_seq` under that lock: without gaps, each once. What a
//! write adds (steps, their ends, events, messages) is kept until its commit and written
//! then in one statement with the run's counters: a write is four round trips to the
//! database however much it holds.

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
    event_seq: Vec<i64>,
    event_turn: Vec<i32>,
    event_kind: Vec<String>,
    event_data: Vec<Value>,
    item_turn: Vec<i32>,
    item_message: Vec<Value>,
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
        Some((epoch, last_seq, last_step, turn)) if epoch == claim.epoch => {
            Ok(Write::new(tx, claim.run_id, (last_seq, last_step, turn)))
        }
        _ => Err(JournalError::LeaseLost),
    }
}

impl Write {
    fn new(
        tx: Transaction<'static, Postgres>,
        run_id: Uuid,
        (last_seq, last_step, turn): (i64, i32, i32),
    ) -> Write {
        Write {
            tx,
            run_id,
            turn,
            last_seq,
            last_step,
            first_seq: last_seq,
            tool_calls: 0,
            usage: None,
            added: Added::default(),
        }
    }

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
        let counters: (i64, i32, i32) = sqlx::query_as(
            "SELECT last_seq, last_step, turns FROM agent_runs WHERE id = $1 FOR UPDATE",
        )
        .bind(run_id)
        .fetch_one(&mut *tx)
        .await?;
        Ok(Write::new(tx, run_id, counters))
    }

    /// Appends an event; its `seq`.
    pub async fn event(&mut self, kind: &str, data: Value) -> Result<i64, sqlx::Error> {
        self.last_seq += 1;
        let added = &mut self.added;
        added.event_seq.push(self.last_seq);
        added.event_turn.push(self.turn);
        added.event_kind.push(kind.to_owned());
        added.event_data.push(data);
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

    /// Commits what the write added, with the run's counters, in one statement; answers
    /// whether events were written. A step begun and ended in the same write is written
    /// ended (the statement's parts see the same snapshot, not each other's rows).
    pub async fn commit(mut self) -> Result<bool, sqlx::Error> {
        let (usage, cost) = self.usage.unwrap_or_default();
        let added = std::mem::take(&mut self.added);
        sqlx::query(COMMIT)
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
            .bind(added.event_seq)
            .bind(added.event_turn)
            .bind(added.event_kind)
            .bind(added.event_data)
            .bind(added.item_turn)
            .bind(added.item_message)
            .execute(&mut *self.tx)
            .await?;
        let wrote_events = self.last_seq > self.first_seq;
        self.tx.commit().await?;
        Ok(wrote_events)
    }
}

/// The one statement of a commit: the steps begun (ended already when their end is in the
/// same write), the ends of steps begun before, the events, the messages (numbered after the
/// conversation's last), and the run's counters.
const COMMIT: &str = "\
WITH ends AS ( \
    SELECT * FROM unnest($18::int[], $19::text[], $20::jsonb[], $21::bigint[]) \
        AS e(seq, state, result, cost) \
), begun AS ( \
    INSERT INTO agent_run_steps (run_id, seq, turn, kind, step_state, call_id, name, args, epoch, \
                                 result, cost_micro, finished_at) \
    SELECT $1, s.seq, s.turn, s.kind, coalesce(e.state, 'intended'), s.call_id, s.name, s.args, \
           s.epoch, e.result, coalesce(e.cost, 0), CASE WHEN e.seq IS NULL THEN NULL ELSE now() END \
    FROM unnest($11::int[], $12::int[], $13::text[], $14::text[], $15::text[], $16::jsonb[], \
                $17::bigint[]) AS s(seq, turn, kind, call_id, name, args, epoch) \
    LEFT JOIN ends e ON e.seq = s.seq \
), ended AS ( \
    UPDATE agent_run_steps t SET step_state = e.state, result = e.result, cost_micro = e.cost, \
                                 finished_at = now() \
    FROM ends e WHERE t.run_id = $1 AND t.seq = e.seq AND e.seq <> ALL($11::int[]) \
), events AS ( \
    INSERT INTO agent_run_events (run_id, seq, turn, type, data) \
    SELECT $1, v.seq, v.turn, v.type, v.data \
    FROM unnest($22::bigint[], $23::int[], $24::text[], $25::jsonb[]) AS v(seq, turn, type, data) \
), items AS ( \
    INSERT INTO agent_run_items (run_id, seq, turn, message) \
    SELECT $1, last.seq + i.n, i.turn, i.message \
    FROM (SELECT coalesce(max(seq), 0) AS seq FROM agent_run_items WHERE run_id = $1) last, \
         unnest($26::int[], $27::jsonb[]) WITH ORDINALITY AS i(turn, message, n) \
) \
UPDATE agent_runs SET last_seq = $2, last_step = $3, turns = $4, \
    tool_calls = tool_calls + $5, cost_micro = cost_micro + $6, updated_at = now(), \
    usage = jsonb_build_object( \
      'input_tokens', coalesce((usage->>'input_tokens')::bigint, 0) + $7, \
      'cached_input_tokens', coalesce((usage->>'cached_input_tokens')::bigint, 0) + $8, \
      'cache_write_tokens', coalesce((usage->>'cache_write_tokens')::bigint, 0) + $9, \
      'output_tokens', coalesce((usage->>'output_tokens')::bigint, 0) + $10) \
WHERE id = $1";
