//! Where each running sandbox lives, as far as this gateway has seen: data-plane calls
//! find their worker without a PostgreSQL round trip. PostgreSQL is the truth; an entry
//! is forgotten when its sandbox stops here or its worker says it is gone.

use std::collections::HashMap;
use std::sync::RwLock;

use uuid::Uuid;

/// Most cached routes per gateway; the cache is cleared when it is full.
const CAPACITY: usize = 100_000;

/// A running sandbox's team and worker.
#[derive(Debug, Clone)]
pub struct Route {
    pub team_id: Uuid,
    pub worker_id: String,
}

#[derive(Default)]
pub struct RouteCache {
    map: RwLock<HashMap<Uuid, Route>>,
}

impl RouteCache {
    pub fn get(&self, id: Uuid) -> Option<Route> {
        self.map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    pub fn insert(&self, id: Uuid, route: Route) {
        let mut map = self
            .map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= CAPACITY {
            map.clear();
        }
        map.insert(id, route);
    }

    pub fn forget(&self, id: Uuid) {
        self.map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
    }
}
