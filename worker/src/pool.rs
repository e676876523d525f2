//! Warm pools: sandboxes started ahead of demand, so creating one is a claim.
//!
//! A pool keeps `size` started sandboxes of one template and size; a claim takes one
//! (or, when the pool is empty, starts one at once) and wakes the refiller. Claimed
//! sandboxes belong to the caller; the pool only ever destroys the ones still waiting.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::runtime::{Runtime, Sandbox};
use crate::spec::Limits;

pub struct WarmPool {
    worker: Arc<Runtime>,
    template: String,
    limits: Limits,
    size: usize,
    ready: Mutex<VecDeque<Sandbox>>,
    wake: Notify,
    closed: AtomicBool,
    refiller: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// How long the refiller waits after a failed start before trying again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

impl WarmPool {
    /// Creates the pool and starts filling it in the background.
    pub fn start(
        worker: Arc<Runtime>,
        template: &str,
        limits: Limits,
        size: usize,
    ) -> Arc<WarmPool> {
        let pool = Arc::new(WarmPool {
            worker,
            template: template.to_owned(),
            limits,
            size,
            ready: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            refiller: Mutex::new(None),
        });
        let refiller = tokio::spawn(Arc::clone(&pool).refill_forever());
        *pool
            .refiller
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(refiller);
        pool
    }

    /// A started sandbox: a waiting one when there is one, else a new one.
    pub async fn claim(&self) -> anyhow::Result<Sandbox> {
        let waiting = self.lock().pop_front();
        self.wake.notify_one();
        match waiting {
            Some(sandbox) => Ok(sandbox),
            None => self.worker.create(&self.template, self.limits).await,
        }
    }

    /// How many sandboxes are waiting to be claimed.
    pub fn ready(&self) -> usize {
        self.lock().len()
    }

    /// Stops refilling and leaves the waiting sandboxes as they are (a crashing worker).
    pub fn stop_refilling(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Stops refilling and destroys the waiting sandboxes (claimed ones are not the pool's).
    pub async fn close(&self) -> anyhow::Result<()> {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
        // A start in progress finishes (and is destroyed) before this returns.
        let refiller = self
            .refiller
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(refiller) = refiller {
            let _ = refiller.await;
        }
        let waiting: Vec<Sandbox> = self.lock().drain(..).collect();
        for sandbox in waiting {
            self.worker.destroy(&sandbox.id).await?;
        }
        Ok(())
    }

    async fn refill_forever(self: Arc<Self>) {
        while !self.is_closed() {
            while self.ready() < self.size && !self.is_closed() {
                match self.worker.create(&self.template, self.limits).await {
                    // Closed while this one was starting: it is nobody's, so it goes.
                    Ok(sandbox) if self.is_closed() => {
                        let _ = self.worker.destroy(&sandbox.id).await;
                    }
                    Ok(sandbox) => self.lock().push_back(sandbox),
                    Err(error) => {
                        tracing::warn!(template = %self.template, error = format!("{error:#}"), "warm pool: starting a sandbox failed");
                        tokio::time::sleep(RETRY_AFTER_FAILURE).await;
                    }
                }
            }
            self.wake.notified().await;
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Sandbox>> {
        self.ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
