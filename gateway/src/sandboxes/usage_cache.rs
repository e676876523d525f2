//! Each team's kept recording bytes as last read, so that the recording quota's check is not
//! a PostgreSQL sum on every recorded command (`recordings::check_quota`). Held in the
//! gateway's state, apart from `recordings` (which reads the state).

use uuid::Uuid;

/// How long a team's recording usage is believed before it is read again: a team may pass
/// its quota by what it records in that time, no more.
const USAGE_FRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// Each team's kept recording bytes as last read.
#[derive(Default)]
pub struct UsageCache(std::sync::Mutex<std::collections::HashMap<Uuid, (std::time::Instant, u64)>>);

impl UsageCache {
    pub(crate) fn get(&self, team: Uuid) -> Option<u64> {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&team)
            .filter(|(read, _)| read.elapsed() < USAGE_FRESH)
            .map(|(_, used)| *used)
    }

    pub(crate) fn put(&self, team: Uuid, used: u64) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() > 10_000 {
            map.retain(|_, (read, _)| read.elapsed() < USAGE_FRESH);
        }
        map.insert(team, (std::time::Instant::now(), used));
    }

    /// Counts bytes a team's recordings just gained, when its usage is known.
    pub(crate) fn add(&self, team: Uuid, bytes: u64) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, used)) = map.get_mut(&team) {
            *used += bytes;
        }
    }

    /// Forgets a team's usage (a recording was deleted: the room shows at once).
    pub fn forget(&self, team: Uuid) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.remove(&team);
    }
}
