//! What preview connections may hold of a gateway: at most `previews.max_connections` relays
//! at once in all (a budget of their own, apart from the API's), at most
//! `max_connections_per_sandbox` for one sandbox and `max_connections_per_preview` for one of
//! its ports. An anonymous client of a public preview cannot hold the gateway's connections,
//! nor a worker's descriptors, past them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::config::PreviewSettings;

/// The counts of open relays.
pub struct PreviewBudget {
    limits: (usize, usize, usize),
    open: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    sandboxes: HashMap<Uuid, usize>,
    previews: HashMap<(Uuid, u16), usize>,
}

/// Which limit a refused relay met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    Gateway,
    Sandbox,
    Preview,
}

/// One open relay; its place is given back when dropped.
pub struct Slot {
    budget: Arc<PreviewBudget>,
    sandbox: Uuid,
    port: u16,
}

impl PreviewBudget {
    pub fn new(settings: &PreviewSettings) -> PreviewBudget {
        PreviewBudget {
            limits: (
                settings.max_connections,
                settings.max_connections_per_sandbox,
                settings.max_connections_per_preview,
            ),
            open: Mutex::default(),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for one more relay to port `port` of `sandbox`, unless a limit is met.
    pub fn enter(self: &Arc<Self>, sandbox: Uuid, port: u16) -> Result<Slot, Full> {
        let (total, per_sandbox, per_preview) = self.limits;
        let mut counts = self.counts();
        if counts.total >= total {
            return Err(Full::Gateway);
        }
        if counts.sandboxes.get(&sandbox).copied().unwrap_or(0) >= per_sandbox {
            return Err(Full::Sandbox);
        }
        if counts.previews.get(&(sandbox, port)).copied().unwrap_or(0) >= per_preview {
            return Err(Full::Preview);
        }
        counts.total += 1;
        metrics::gauge!("sandbase_preview_connections").set(counts.total as f64);
        *counts.sandboxes.entry(sandbox).or_default() += 1;
        *counts.previews.entry((sandbox, port)).or_default() += 1;
        Ok(Slot {
            budget: Arc::clone(self),
            sandbox,
            port,
        })
    }

    /// Relays open now (all of them).
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.counts().total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.budget.counts();
        counts.total -= 1;
        metrics::gauge!("sandbase_preview_connections").set(counts.total as f64);
        if let Some(count) = counts.sandboxes.get_mut(&self.sandbox) {
            *count -= 1;
            if *count == 0 {
                counts.sandboxes.remove(&self.sandbox);
            }
        }
        let key = (self.sandbox, self.port);
        if let Some(count) = counts.previews.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                counts.previews.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_holds_and_places_come_back() {
        let settings = PreviewSettings {
            max_connections: 5,
            max_connections_per_sandbox: 3,
            max_connections_per_preview: 2,
            ..PreviewSettings::default()
        };
        let budget = Arc::new(PreviewBudget::new(&settings));
        let (one, two) = (Uuid::new_v4(), Uuid::new_v4());
        let a = budget.enter(one, 80).unwrap();
        let _b = budget.enter(one, 80).unwrap();
        assert_eq!(budget.enter(one, 80).err(), Some(Full::Preview));
        let _c = budget.enter(one, 81).unwrap();
        assert_eq!(budget.enter(one, 82).err(), Some(Full::Sandbox));
        let _d = budget.enter(two, 80).unwrap();
        let _e = budget.enter(two, 81).unwrap();
        assert_eq!(budget.enter(two, 82).err(), Some(Full::Gateway));
        drop(a);
        let _f = budget.enter(two, 82).unwrap();
        assert_eq!(budget.open(), 5);
    }
}
