//! Each calling key's lineage with its model lists, read once per gateway (a leaf module:
//! the store in the gateway's state holds it).

use uuid::Uuid;

/// Each key's lineage with its model lists, as read once (they never change; a revoked key
/// is refused before it gets here).
#[derive(Default)]
pub struct Lineages {
    keys: std::sync::Mutex<std::collections::HashMap<Uuid, Lineage>>,
}

type Lineage = std::sync::Arc<Vec<(Uuid, Option<Vec<String>>)>>;

/// Most keys remembered (the map is emptied when full).
const MAX_KEYS: usize = 100_000;

impl Lineages {
    fn keys(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Uuid, Lineage>> {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn get(&self, key: Uuid) -> Option<Lineage> {
        self.keys().get(&key).cloned()
    }

    pub fn put(&self, key: Uuid, rows: Vec<(Uuid, Option<Vec<String>>)>) -> Lineage {
        let rows = std::sync::Arc::new(rows);
        let mut keys = self.keys();
        if keys.len() >= MAX_KEYS {
            keys.clear();
        }
        keys.insert(key, std::sync::Arc::clone(&rows));
        rows
    }
}
