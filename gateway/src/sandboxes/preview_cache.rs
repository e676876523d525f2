//! A preview as stored, and each gateway's cache of the previews it read (a request to a
//! preview host needs one; a query each time cost a quarter of a millisecond). A leaf
//! module: the gateway's state holds the cache.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A preview as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PreviewRow {
    pub sandbox_id: Uuid,
    pub port: i32,
    pub team_id: Uuid,
    pub public: bool,
    pub token_hash: Vec<u8>,
    pub created_at: DateTime<Utc>,
}

/// How long a gateway keeps a preview it read.
pub const CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(1);
/// Most previews cached at once (the cache is emptied when it is full).
const CACHE_CAPACITY: usize = 10_000;

/// Previews read recently, so that each request to a preview host is not a query.
type Cached = std::collections::HashMap<(Uuid, u16), (std::time::Instant, Option<PreviewRow>)>;

#[derive(Default)]
pub struct PreviewCache {
    rows: std::sync::Mutex<Cached>,
}

impl PreviewCache {
    fn rows(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn get(&self, sandbox: Uuid, port: u16) -> Option<Option<PreviewRow>> {
        let rows = self.rows();
        let (read_at, row) = rows.get(&(sandbox, port))?;
        (read_at.elapsed() < CACHE_TTL).then(|| row.clone())
    }

    pub fn put(&self, sandbox: Uuid, port: u16, row: Option<PreviewRow>) {
        let mut rows = self.rows();
        if rows.len() >= CACHE_CAPACITY {
            rows.clear();
        }
        rows.insert((sandbox, port), (std::time::Instant::now(), row));
    }

    /// Forgets a preview opened, re-opened or closed through this gateway.
    pub fn forget(&self, sandbox: Uuid, port: u16) {
        self.rows().remove(&(sandbox, port));
    }
}
