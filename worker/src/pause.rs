//! Pausing and resuming hosted sandboxes: containerd freezes the task (the cgroup freezer
//! under runc; gVisor stops the Sentry's tasks), so processes, shell sessions and their
//! memory stay as they are and use no CPU. A sandbox is paused when the gateway asks
//! (commands are then refused until it is resumed), or by itself once no call has reached it
//! for its `auto_pause_after_idle_secs` (the next call resumes it first).
//!
//! Every call that reaches a sandbox's agent goes through [`Node::active`], which holds the
//! sandbox busy for as long as the call (or its streamed answer) lasts: a sandbox is never
//! frozen under a running command, and a call never waits on a frozen agent.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use uuid::Uuid;

use crate::exec::Hosted;
use crate::node::{Node, NodeError};
use crate::pause_state::Reason;

/// How often idle sandboxes are looked for.
pub const IDLE_CHECK_EVERY: Duration = Duration::from_millis(500);

/// A sandbox a call is using: busy until this is dropped (moved into a streamed answer, it
/// lasts as long as the answer).
pub struct Active(Arc<Hosted>);

impl Deref for Active {
    type Target = Arc<Hosted>;

    fn deref(&self) -> &Arc<Hosted> {
        &self.0
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.pause.touch();
        self.0.pause.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Node {
    /// A hosted sandbox for a call that reaches its agent: refused while the gateway holds
    /// it paused, resumed first when it paused itself.
    pub async fn active(&self, id: Uuid) -> Result<Active, NodeError> {
        let hosted = self.get(id)?;
        let pause = &hosted.pause;
        pause.busy.fetch_add(1, Ordering::SeqCst);
        pause.touch();
        let active = Active(Arc::clone(&hosted));
        // Busy before this read: an idle pause that began earlier set `paused` first, and
        // one that begins later sees the call (see `pause_if_idle`).
        if pause.is_paused() {
            let mut reason = pause.reason.lock().await;
            match *reason {
                Some(Reason::Asked) => return Err(NodeError::Paused),
                Some(Reason::Idle) => self.thaw(&hosted, &mut reason).await?,
                None => {}
            }
        }
        Ok(active)
    }

    /// Pauses a sandbox at the gateway's request (a sandbox that paused itself stays paused,
    /// now until it is resumed).
    pub async fn pause(&self, id: Uuid) -> Result<(), NodeError> {
        let hosted = self.get(id)?;
        let mut reason = hosted.pause.reason.lock().await;
        if reason.is_none() {
            hosted.pause.paused.store(true, Ordering::SeqCst);
            self.freeze(&hosted).await?;
        }
        *reason = Some(Reason::Asked);
        Ok(())
    }

    /// Resumes a paused sandbox; resuming a running one changes nothing.
    pub async fn resume(&self, id: Uuid) -> Result<(), NodeError> {
        let hosted = self.get(id)?;
        let mut reason = hosted.pause.reason.lock().await;
        if reason.is_some() {
            self.thaw(&hosted, &mut reason).await?;
        }
        hosted.pause.touch();
        Ok(())
    }

    /// The hosted sandboxes that are paused.
    pub fn paused_ids(&self) -> Vec<Uuid> {
        self.hosted_all()
            .into_iter()
            .filter(|hosted| hosted.pause.is_paused())
            .map(|hosted| hosted.id)
            .collect()
    }

    /// Pauses every sandbox idle for longer than it allows.
    pub async fn pause_idle(&self) {
        for hosted in self.hosted_all() {
            if hosted.pause.idle()
                && let Err(error) = self.pause_if_idle(&hosted).await
            {
                tracing::warn!(id = %hosted.id, error = %error, "pausing an idle sandbox");
            }
        }
    }

    async fn pause_if_idle(&self, hosted: &Hosted) -> Result<(), NodeError> {
        let pause = &hosted.pause;
        let mut reason = pause.reason.lock().await;
        if reason.is_some() {
            return Ok(());
        }
        pause.paused.store(true, Ordering::SeqCst);
        // A call that began before `paused` was set is seen here; one that begins after
        // sees `paused` and waits for the lock.
        if !pause.idle() {
            pause.paused.store(false, Ordering::SeqCst);
            return Ok(());
        }
        self.freeze(hosted).await?;
        *reason = Some(Reason::Idle);
        tracing::info!(id = %hosted.id, "paused an idle sandbox");
        Ok(())
    }

    /// Freezes the task (`paused` is already set; cleared again if the freeze fails).
    async fn freeze(&self, hosted: &Hosted) -> Result<(), NodeError> {
        let frozen = self
            .runtime()
            .containerd()
            .pause_task(&hosted.sandbox.id)
            .await;
        if let Err(error) = frozen {
            hosted.pause.paused.store(false, Ordering::SeqCst);
            return Err(NodeError::Internal(error));
        }
        hosted.meter.paused();
        Ok(())
    }

    async fn thaw(&self, hosted: &Hosted, reason: &mut Option<Reason>) -> Result<(), NodeError> {
        self.runtime()
            .containerd()
            .resume_task(&hosted.sandbox.id)
            .await
            .map_err(NodeError::Internal)?;
        hosted.meter.resumed();
        *reason = None;
        hosted.pause.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Thaws a paused sandbox about to be destroyed (best effort: a frozen task is killed
    /// all the same, but its shim deletes it sooner once thawed).
    pub(crate) async fn thaw_for_destroy(&self, hosted: &Hosted) {
        let mut reason = hosted.pause.reason.lock().await;
        if reason.is_some()
            && let Err(error) = self.thaw(hosted, &mut reason).await
        {
            tracing::debug!(id = %hosted.id, error = %error, "thawing before destroy");
        }
    }
}

/// Pauses the node's idle sandboxes every [`IDLE_CHECK_EVERY`] until the node is gone.
pub fn spawn_idle_pauser(node: &Arc<Node>) -> tokio::task::JoinHandle<()> {
    let node = Arc::downgrade(node);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(IDLE_CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(node) = node.upgrade() else { return };
            node.pause_idle().await;
        }
    })
}
