//! A run as the gateway stepping it holds it: its row, its key's head for every call, its
//! model's family, its prompt and tools, its lease — and what ends a drive: the lease lost,
//! or the run settled (`idle`, `requires_action`, or a final status, which destroys the
//! sandbox the run made and revokes its key).

use std::sync::Arc;
use std::time::Duration;

use sandbase_harness::tools::ToolDef;
use sandbase_harness::{Family, ToolKind};
use sandbase_mcp::{ApiRequest, Backend, Caller};
use serde_json::{Value, json};

use super::journal::{self, JournalError};
use super::lease::Lease;
use super::lifecycle::{self, Status};
use super::rows::AgentRunRow;
use crate::auth::key_cache::Invalidation;
use crate::state::AppState;

pub const DEFAULT_MAX_TURNS: u32 = 100;
pub const DEFAULT_MAX_TOOL_CALLS: u32 = 1000;
pub const DEFAULT_MAX_WALL_SECS: u64 = 86_400;

/// Why a drive stopped before the run settled.
#[derive(Debug, thiserror::Error)]
pub enum Halt {
    #[error("the lease of this run was lost")]
    LeaseLost,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl From<JournalError> for Halt {
    fn from(error: JournalError) -> Halt {
        match error {
            JournalError::LeaseLost => Halt::LeaseLost,
            JournalError::Database(error) => Halt::Database(error),
        }
    }
}

/// Whether the loop goes on after a step.
pub enum Flow {
    Continue,
    /// The run waits or ended: the drive is over.
    Stop,
}

/// A run being stepped here, with what every step needs.
pub struct Run<'a, B> {
    pub state: &'a AppState,
    pub backend: &'a B,
    pub lease: Arc<Lease>,
    pub row: AgentRunRow,
    /// The head of every call the run makes (its key).
    pub parts: http::request::Parts,
    pub family: Family,
    pub prices: sandbase_harness::Prices,
    pub max_output: u64,
    pub context_window: u64,
    /// How many tool outputs the last model call left out (a `context.elided` event tells
    /// each time more are).
    pub elided: std::sync::atomic::AtomicUsize,
    pub system: String,
    pub tools: Vec<ToolDef>,
    /// The MCP tools the run offers (its store and remote servers').
    pub mcp: Vec<super::remote_mcp::Offer>,
    /// The conversation as far as it was read (the number of its last message): each step
    /// reads only what was appended since.
    pub conversation: std::sync::Mutex<(i32, Vec<sandbase_api::conversation::Message>)>,
}

impl<B: Backend> Run<'_, B> {
    pub fn caller(&self) -> Caller<'_> {
        Caller {
            parts: Some(&self.parts),
            progress: None,
        }
    }

    /// What a call of the model is.
    pub fn kind(&self, call: &sandbase_api::conversation::ToolCall) -> ToolKind {
        match self.mcp.iter().find(|offer| offer.model_name == call.name) {
            Some(offer) => ToolKind::Mcp {
                read_only: offer.read_only,
            },
            None => sandbase_harness::tools::kind(&self.row.tools.0, call),
        }
    }

    pub fn sandbox(&self) -> String {
        self.row
            .sandbox_id
            .map(|id| id.to_string())
            .unwrap_or_default()
    }

    /// The run's row now, and the whole conversation, read on from where the last step
    /// read it — in one round trip.
    pub async fn load(
        &self,
        connection: &mut sqlx::PgConnection,
    ) -> Result<(AgentRunRow, Vec<sandbase_api::conversation::Message>), sqlx::Error> {
        let after = self.conversation.lock().map_or(0, |read| read.0);
        let (row, new) = super::rows::load_after(connection, self.row.id, after).await?;
        let mut read = self
            .conversation
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (seq, message) in new {
            if seq > read.0 {
                read.0 = seq;
                read.1.push(message);
            }
        }
        Ok((row, read.1.clone()))
    }

    /// Fails unless this gateway still holds the lease: checked before every side effect.
    pub fn check_lease(&self) -> Result<(), Halt> {
        if self.lease.is_valid() {
            Ok(())
        } else {
            Err(Halt::LeaseLost)
        }
    }

    /// Commits a journal write and tells this gateway's followers of the run.
    pub async fn commit(&self, write: journal::Write) -> Result<(), Halt> {
        if write.commit().await? {
            let _ = self.state.harness.events.send(self.row.id);
        }
        Ok(())
    }

    /// Commits a quick write of the run (see `journal::Quick`).
    pub async fn commit_quick(&self, write: journal::Quick) -> Result<(), Halt> {
        if write.commit(&self.state.db).await? {
            let _ = self.state.harness.events.send(self.row.id);
        }
        Ok(())
    }

    /// A snapshot of the sandbox the run made at a turn's end, when it keeps checkpoints.
    async fn checkpoint(&self, status: Status) -> Option<uuid::Uuid> {
        let sandbox = self.row.sandbox_id.filter(|_| self.row.owns_sandbox)?;
        if status != Status::Idle || self.row.checkpoints != "every_turn" {
            return None;
        }
        super::release::snapshot(self.backend, &self.parts, sandbox).await
    }

    /// Ends the drive with the run in `status` (`idle`, `requires_action` or a final one):
    /// a final status destroys the sandbox the run made, first (its key is revoked with it).
    pub async fn settle(
        &self,
        status: Status,
        error: Option<(&str, String)>,
        required: Value,
    ) -> Result<Flow, Halt> {
        self.check_lease()?;
        let checkpoint = self.checkpoint(status).await;
        if self.row.owns_sandbox && self.row.sandbox_id.is_some() {
            // A final status destroys the sandbox the run made; a wait pauses it (billed as
            // paused) until the run is stepped again.
            let path = format!("/v1/sandboxes/{}", self.sandbox());
            let request = if status.is_final() {
                ApiRequest::delete(path)
            } else {
                ApiRequest::post(format!("{path}/pause"), json!({}))
            };
            if let Err(why) = self.backend.call(Some(&self.parts), request).await {
                tracing::warn!(error = %why, "destroying or pausing an agent run's sandbox failed");
            }
        }
        let error = error.map(|(code, message)| json!({ "code": code, "message": message }));
        let mut write = journal::begin(&self.state.db, &self.lease).await?;
        if let Some(snapshot) = checkpoint {
            sqlx::query("UPDATE agent_runs SET checkpoint_snapshot = $2 WHERE id = $1")
                .bind(self.row.id)
                .bind(snapshot)
                .execute(&mut *write.tx)
                .await?;
            let turn = write.turn;
            write
                .event(
                    "checkpoint.taken",
                    json!({ "snapshot_id": snapshot, "turn": turn }),
                )
                .await?;
        }
        if matches!(status, Status::Idle) || status.is_final() {
            let turn = write.turn;
            write
                .event("turn.completed", json!({ "turn": turn }))
                .await?;
        }
        let (event, revoked) =
            lifecycle::settle(&mut write.tx, self.row.id, status, error, required).await?;
        write.event("run.status", event).await?;
        self.commit(write).await?;
        if let Some(public_id) = revoked {
            let invalidator = &self.state.auth.invalidator;
            invalidator.publish(Invalidation::Key(public_id)).await;
        }
        Ok(Flow::Stop)
    }
}

/// How long to wait before retrying a model call: its `Retry-After` (at most 30 s), else
/// 1, 2, 4 s.
pub fn backoff(attempt: u32, retry_after: Option<&str>) -> Duration {
    retry_after
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(|secs| Duration::from_secs(secs.min(30)))
        .unwrap_or_else(|| Duration::from_secs(1 << attempt.min(4).saturating_sub(1)))
}
