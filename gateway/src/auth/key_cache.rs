//! The in-process cache of API keys and its cross-instance invalidation over Redis pub/sub.
//!
//! The hot path (a cached key) costs one SHA-256 and a hash-map read: no Postgres. The cache
//! is trusted only while this gateway's invalidation subscription is live, so a revocation
//! published by any gateway is honoured here at once; while it is down every lookup goes to
//! Postgres. A subscription can also die silently (a stalled connection, a half-open socket
//! after a network partition): the listener pings on it and gives it up when the answer does
//! not come in time, and every entry expires after `ttl` regardless, which bounds how long a
//! revocation can go unseen. Unknown public ids are remembered for a short while, so a flood
//! of one made-up key costs one query (new keys get random ids nobody could have presented).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use uuid::Uuid;

use super::api_key::KeyRecord;

/// How long an unknown public id is answered from memory.
const UNKNOWN_TTL: Duration = Duration::from_secs(10);
/// Most unknown public ids remembered; past it the oldest half is dropped.
const UNKNOWN_CAPACITY: usize = 10_000;

/// What the cache knows of a public id.
pub enum Lookup {
    Known(Arc<KeyRecord>),
    /// Looked up lately and not found.
    Unknown,
    /// Ask Postgres.
    Miss,
}

struct Entry {
    record: Arc<KeyRecord>,
    expires: Instant,
}

/// The in-process key cache.
pub struct KeyCache {
    entries: RwLock<HashMap<String, Entry>>,
    unknown: RwLock<HashMap<String, Instant>>,
    capacity: usize,
    ttl: Duration,
    /// Bumped by every invalidation, so a lookup that raced one does not re-insert stale data.
    epoch: AtomicU64,
    /// True while the invalidation subscription is connected and answering.
    live: AtomicBool,
    /// Keys read from Postgres since start-up.
    lookups: AtomicU64,
}

impl KeyCache {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        KeyCache {
            entries: RwLock::new(HashMap::new()),
            unknown: RwLock::new(HashMap::new()),
            capacity: capacity.max(1),
            ttl,
            epoch: AtomicU64::new(0),
            live: AtomicBool::new(false),
            lookups: AtomicU64::new(0),
        }
    }

    /// Counts a read from Postgres (what a miss costs).
    pub fn note_lookup(&self) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("sandbase_key_lookups_total").increment(1);
    }

    /// Keys read from Postgres since start-up.
    #[cfg(feature = "testing")]
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    pub fn get(&self, public_id: &str) -> Lookup {
        if !self.live.load(Ordering::Acquire) {
            return Lookup::Miss;
        }
        let now = Instant::now();
        if let Some(entry) = read(&self.entries).get(public_id)
            && entry.expires > now
        {
            return Lookup::Known(entry.record.clone());
        }
        match read(&self.unknown).get(public_id) {
            Some(expires) if *expires > now => Lookup::Unknown,
            _ => Lookup::Miss,
        }
    }

    /// The epoch to pass to [`KeyCache::insert`] for a lookup that starts now.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Caches `record` unless an invalidation happened since `epoch` was read, and returns
    /// the record to use: the one already cached when a concurrent lookup got there first,
    /// so every request for a key shares one record (and its rate-limit lease).
    pub fn insert(&self, epoch: u64, record: Arc<KeyRecord>) -> Arc<KeyRecord> {
        let mut entries = write(&self.entries);
        if self.epoch.load(Ordering::Acquire) != epoch || !self.live.load(Ordering::Acquire) {
            return record;
        }
        let now = Instant::now();
        if let Some(existing) = entries.get(&record.public_id)
            && existing.expires > now
        {
            return existing.record.clone();
        }
        if entries.len() >= self.capacity {
            // Crude but bounded: at capacity, start over rather than track recency.
            entries.clear();
        }
        let entry = Entry {
            record: record.clone(),
            expires: now + self.ttl,
        };
        entries.insert(record.public_id.clone(), entry);
        record
    }

    /// Remembers that no key has this public id (unless an invalidation happened since
    /// `epoch` was read).
    pub fn insert_unknown(&self, epoch: u64, public_id: &str) {
        let mut unknown = write(&self.unknown);
        if self.epoch.load(Ordering::Acquire) != epoch || !self.live.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        if unknown.len() >= UNKNOWN_CAPACITY {
            unknown.retain(|_, expires| *expires > now + UNKNOWN_TTL / 2);
            if unknown.len() >= UNKNOWN_CAPACITY {
                unknown.clear();
            }
        }
        unknown.insert(public_id.to_owned(), now + UNKNOWN_TTL);
    }

    pub fn invalidate_key(&self, public_id: &str) {
        let mut entries = write(&self.entries);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        entries.remove(public_id);
        write(&self.unknown).remove(public_id);
    }

    pub fn invalidate_team(&self, team_id: Uuid) {
        let mut entries = write(&self.entries);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        entries.retain(|_, entry| entry.record.team_id != team_id);
    }

    pub fn clear(&self) {
        let mut entries = write(&self.entries);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        entries.clear();
        write(&self.unknown).clear();
    }

    fn set_live(&self, live: bool) {
        if !live {
            self.live.store(false, Ordering::Release);
        }
        self.clear();
        if live {
            self.live.store(true, Ordering::Release);
        }
    }

    #[cfg(feature = "testing")]
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A panic while holding this lock cannot leave the map half-updated, so poison is ignored.
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What an invalidation message names.
pub enum Invalidation {
    Key(String),
    Team(Uuid),
}

impl Invalidation {
    fn encode(&self) -> String {
        match self {
            Invalidation::Key(public_id) => format!("key:{public_id}"),
            Invalidation::Team(team_id) => format!("team:{team_id}"),
        }
    }

    fn apply(message: &str, cache: &KeyCache) {
        match message.split_once(':') {
            Some(("key", public_id)) => cache.invalidate_key(public_id),
            Some(("team", team)) => match team.parse() {
                Ok(team_id) => cache.invalidate_team(team_id),
                Err(_) => cache.clear(),
            },
            // Unknown messages (a newer gateway?) clear everything: always safe.
            _ => cache.clear(),
        }
    }
}

/// Publishes invalidations to every gateway (this one included, through its own subscription).
#[derive(Clone)]
pub struct Invalidator {
    redis: redis::aio::ConnectionManager,
    channel: String,
    cache: Arc<KeyCache>,
}

impl Invalidator {
    pub fn new(
        redis: redis::aio::ConnectionManager,
        channel: String,
        cache: Arc<KeyCache>,
    ) -> Self {
        Invalidator {
            redis,
            channel,
            cache,
        }
    }

    /// Call after the change is committed. Applies locally at once, then tells the others.
    pub async fn publish(&self, invalidation: Invalidation) {
        let message = invalidation.encode();
        Invalidation::apply(&message, &self.cache);
        let mut redis = self.redis.clone();
        for attempt in 0..3u64 {
            let result: redis::RedisResult<i64> = redis::cmd("PUBLISH")
                .arg(&self.channel)
                .arg(&message)
                .query_async(&mut redis)
                .await;
            match result {
                Ok(_) => return,
                Err(error) => {
                    tracing::warn!(error = %error, attempt, "publishing a key invalidation failed");
                    tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
                }
            }
        }
        // Other gateways lose their subscription when Redis is unreachable (their pings go
        // unanswered), and then bypass their caches; the change itself is committed in Postgres.
        tracing::error!("key invalidation could not be published");
    }
}

/// Keeps this gateway subscribed to invalidations, reconnecting with backoff. The cache is
/// used only while the subscription is up and answers a ping every `ping_every`.
pub async fn run_invalidation_listener(
    client: redis::Client,
    channel: String,
    cache: Arc<KeyCache>,
    ping_every: Duration,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let subscribed = tokio::time::timeout(ping_every.max(Duration::from_secs(1)), async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub.split())
        })
        .await;
        match subscribed {
            Ok(Ok((sink, stream))) => {
                backoff = Duration::from_millis(100);
                cache.set_live(true);
                tracing::debug!("key invalidation subscription is live");
                let why = listen(sink, stream, &cache, ping_every).await;
                cache.set_live(false);
                tracing::warn!("key invalidation subscription lost ({why}); reconnecting");
            }
            Ok(Err(error)) => {
                cache.set_live(false);
                tracing::warn!(error = %error, "subscribing to key invalidations failed");
            }
            Err(_) => {
                cache.set_live(false);
                tracing::warn!("subscribing to key invalidations timed out");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Applies invalidations until the subscription ends or misses a ping; says which.
async fn listen(
    mut sink: redis::aio::PubSubSink,
    mut stream: redis::aio::PubSubStream,
    cache: &KeyCache,
    ping_every: Duration,
) -> &'static str {
    let mut ticker = tokio::time::interval(ping_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            message = stream.next() => match message {
                Some(message) => match message.get_payload::<String>() {
                    Ok(payload) => Invalidation::apply(&payload, cache),
                    Err(_) => cache.clear(),
                },
                None => return "it ended",
            },
            _ = ticker.tick() => {
                let answer = tokio::time::timeout(ping_every, sink.ping::<redis::Value>()).await;
                if !matches!(answer, Ok(Ok(_))) {
                    return "its ping went unanswered";
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_ids_are_remembered_until_invalidated() {
        let cache = KeyCache::new(10, Duration::from_secs(60));
        cache.set_live(true);
        assert!(matches!(cache.get("abc"), Lookup::Miss));
        cache.insert_unknown(cache.epoch(), "abc");
        assert!(matches!(cache.get("abc"), Lookup::Unknown));
        cache.invalidate_key("abc");
        assert!(matches!(cache.get("abc"), Lookup::Miss));
        // A lookup that raced an invalidation leaves nothing behind.
        let epoch = cache.epoch();
        cache.clear();
        cache.insert_unknown(epoch, "abc");
        assert!(matches!(cache.get("abc"), Lookup::Miss));
    }

    #[test]
    fn nothing_is_answered_from_memory_while_the_subscription_is_down() {
        let cache = KeyCache::new(10, Duration::from_secs(60));
        cache.set_live(true);
        cache.insert_unknown(cache.epoch(), "abc");
        cache.set_live(false);
        assert!(matches!(cache.get("abc"), Lookup::Miss));
    }
}
