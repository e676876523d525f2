//! Per-key rate limiting: GCRA (the generic cell rate algorithm) in one atomic Lua script
//! on Redis' clock, so every gateway shares one limit.
//!
//! A hot key would cost one Redis round trip per request. Instead, each gateway leases a
//! few tokens at a time from the shared bucket (about 1/20 s worth at the key's rate, at
//! most a quarter of the burst; one token — no lease — for slow keys) and spends them
//! locally, topping the lease up in the background before it runs low or expires, so an
//! active key's requests do not wait on Redis. Redis stays the authority: every admitted
//! request spends a token the script granted, so over any window a gateway admits at most
//! what the bucket granted plus the one lease it holds. A lease idle for `LEASE_TTL` is
//! void, which can only under-admit.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::Script;

/// GCRA taking up to ARGV[3] cells at once. KEYS[1]: the bucket. ARGV[1]: emission interval
/// in microseconds (1 s / rate). ARGV[2]: burst. ARGV[3]: cells wanted.
/// Returns {granted, retry_after_us}: granted is 0 when even one cell would exceed the burst.
const GCRA: &str = r#"
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local wanted = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local capacity = interval * burst
local available = math.floor((capacity - (tat - now)) / interval)
if available < 1 then
  return {0, tat + interval - now - capacity}
end
local granted = math.min(wanted, available)
local new_tat = tat + granted * interval
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000) + 1)
return {granted, 0}
"#;

/// How long leased tokens may be spent locally.
const LEASE_TTL: Duration = Duration::from_millis(100);
/// Largest share of the burst one gateway may hold at once.
const MAX_LEASE_SHARE_OF_BURST: u32 = 4;

#[derive(Clone)]
pub struct RateLimiter {
    script: Arc<Script>,
    prefix: String,
}

/// Tokens one gateway holds for one key, lock-free: the hot path must not park a thread
/// on a mutex whose holder was preempted (this is a 2-core-friendly design).
#[derive(Debug, Default)]
pub struct Lease {
    remaining: AtomicU32,
    /// Milliseconds since [`epoch`] after which the remaining tokens are void.
    expires_ms: AtomicU64,
    /// A background top-up is in flight.
    refilling: AtomicBool,
    /// Held while asking Redis for this lease, so a burst of requests arriving at an empty
    /// lease makes one call per lease's worth of tokens rather than one each (which would
    /// strand most of the granted tokens in a lease nobody is left to spend).
    refill_lock: tokio::sync::Mutex<()>,
}

impl Lease {
    /// Takes one token if the lease is live; says whether the caller should top it up
    /// (running low, or expiring soon), so an active key never waits on Redis.
    fn take(&self, now_ms: u64, lease_size: u32) -> (bool, bool) {
        let expires_ms = self.expires_ms.load(Ordering::Acquire);
        if expires_ms <= now_ms {
            return (false, false);
        }
        let taken = self
            .remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |remaining| {
                remaining.checked_sub(1)
            });
        match taken {
            Ok(before) => {
                let low = before - 1 < lease_size / 2;
                let expiring = expires_ms - now_ms < LEASE_TTL.as_millis() as u64 / 2;
                let refill = (low || expiring) && !self.refilling.swap(true, Ordering::AcqRel);
                (true, refill)
            }
            Err(_) => (false, false),
        }
    }

    /// How many tokens a top-up should ask for: enough to fill the lease, at least one
    /// (a grant renews the lease's expiry).
    fn wanted(&self, lease_size: u32) -> u32 {
        lease_size
            .saturating_sub(self.remaining.load(Ordering::Acquire))
            .max(1)
    }

    fn add(&self, tokens: u32, now_ms: u64) {
        if tokens == 0 {
            return;
        }
        if self.expires_ms.load(Ordering::Acquire) <= now_ms {
            // Tokens of an expired lease are void; dropping them can only under-admit.
            self.remaining.store(0, Ordering::Release);
        }
        self.remaining.fetch_add(tokens, Ordering::AcqRel);
        self.expires_ms
            .store(now_ms + LEASE_TTL.as_millis() as u64, Ordering::Release);
    }
}

/// The leases of team buckets this gateway holds, one per team seen lately (bounded: past
/// `TEAM_LEASES` teams the map starts over, which can only under-admit).
#[derive(Default)]
pub struct TeamLeases {
    leases: std::sync::Mutex<std::collections::HashMap<uuid::Uuid, Arc<Lease>>>,
}

const TEAM_LEASES: usize = 100_000;

impl TeamLeases {
    pub fn of(&self, team: uuid::Uuid) -> Arc<Lease> {
        let mut leases = self
            .leases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if leases.len() >= TEAM_LEASES && !leases.contains_key(&team) {
            leases.clear();
        }
        Arc::clone(leases.entry(team).or_default())
    }
}

/// The result of one admission check.
#[derive(Debug, Clone, Copy)]
pub enum Decision {
    Allowed,
    Limited { retry_after_secs: u64 },
}

impl RateLimiter {
    pub fn new(prefix: &str) -> Self {
        RateLimiter {
            script: Arc::new(Script::new(GCRA)),
            prefix: format!("{prefix}rl:"),
        }
    }

    /// Counts one request against `subject` at `per_second` sustained, `burst` at once.
    /// With a `lease` (the caller's cached key record holds one), hot keys spend tokens
    /// leased from Redis in batches.
    pub async fn check(
        &self,
        redis: &mut redis::aio::ConnectionManager,
        subject: &str,
        lease: Option<&Arc<Lease>>,
        per_second: u32,
        burst: u32,
    ) -> redis::RedisResult<Decision> {
        let per_second = per_second.max(1);
        let burst = burst.max(1);
        let lease_size = lease_size(per_second, burst);
        let lease = lease.filter(|_| lease_size > 1);
        if let Some(lease) = lease {
            let (admitted, refill) = lease.take(now_ms(), lease_size);
            if refill {
                // Top the lease up before it runs dry, so hot keys rarely wait on Redis.
                let limiter = self.clone();
                let mut redis = redis.clone();
                let subject = subject.to_owned();
                let lease = lease.clone();
                tokio::spawn(async move {
                    let _refill = lease.refill_lock.lock().await;
                    let wanted = lease.wanted(lease_size);
                    match limiter
                        .acquire(&mut redis, &subject, per_second, burst, wanted)
                        .await
                    {
                        Ok((granted, _)) => lease.add(granted, now_ms()),
                        Err(error) => {
                            tracing::debug!(error = %error, "topping up a rate-limit lease failed")
                        }
                    }
                    lease.refilling.store(false, Ordering::Release);
                });
            }
            if admitted {
                return Ok(Decision::Allowed);
            }
        }
        let _refill = match lease {
            Some(lease) => {
                let guard = lease.refill_lock.lock().await;
                // Whoever held the lock before may have filled the lease.
                if lease.take(now_ms(), lease_size).0 {
                    return Ok(Decision::Allowed);
                }
                Some(guard)
            }
            None => None,
        };
        let wanted = if lease.is_some() { lease_size } else { 1 };
        let (granted, retry_after_us) = self
            .acquire(redis, subject, per_second, burst, wanted)
            .await?;
        if granted < 1 {
            // Retry-After is in whole seconds; round up so a client that obeys it is admitted.
            let retry_after_secs = retry_after_us.div_ceil(1_000_000).max(1);
            return Ok(Decision::Limited { retry_after_secs });
        }
        // One token is this request's; the rest are kept for the next ones.
        if let Some(lease) = lease {
            lease.add(granted - 1, now_ms());
        }
        Ok(Decision::Allowed)
    }

    /// Counts one attempt against `subject`, allowing `count` per `window`: a bucket of
    /// `count` cells that refills evenly over the window (for slow limits such as sign-ups
    /// an hour, which a per-second rate cannot express).
    pub async fn check_window(
        &self,
        redis: &mut redis::aio::ConnectionManager,
        subject: &str,
        count: u32,
        window: Duration,
    ) -> redis::RedisResult<Decision> {
        let count = count.max(1);
        let interval_us = (window.as_micros() as u64 / u64::from(count)).max(1);
        let bucket = format!("{subject}:{count}/{}s", window.as_secs());
        let (granted, retry_after_us) = self
            .acquire_at(redis, &bucket, interval_us, count, 1)
            .await?;
        Ok(if granted < 1 {
            Decision::Limited {
                retry_after_secs: retry_after_us.div_ceil(1_000_000).max(1),
            }
        } else {
            Decision::Allowed
        })
    }

    /// Takes up to `wanted` tokens from the shared bucket: (granted, retry-after in µs).
    async fn acquire(
        &self,
        redis: &mut redis::aio::ConnectionManager,
        subject: &str,
        per_second: u32,
        burst: u32,
        wanted: u32,
    ) -> redis::RedisResult<(u32, u64)> {
        let interval_us = (1_000_000 / u64::from(per_second)).max(1);
        // The limit is part of the bucket's name: a changed limit starts a fresh bucket
        // rather than inheriting a schedule computed at another rate.
        let bucket = format!("{subject}:{per_second}/{burst}");
        self.acquire_at(redis, &bucket, interval_us, burst, wanted)
            .await
    }

    /// The GCRA script on `bucket`: one cell every `interval_us`, at most `burst` at once.
    async fn acquire_at(
        &self,
        redis: &mut redis::aio::ConnectionManager,
        bucket: &str,
        interval_us: u64,
        burst: u32,
        wanted: u32,
    ) -> redis::RedisResult<(u32, u64)> {
        let (granted, retry_after_us): (i64, i64) = self
            .script
            .key(format!("{}{bucket}", self.prefix))
            .arg(interval_us)
            .arg(burst)
            .arg(wanted)
            .invoke_async(redis)
            .await?;
        Ok((
            u32::try_from(granted).unwrap_or(0),
            u64::try_from(retry_after_us).unwrap_or(0),
        ))
    }
}

/// Milliseconds since this process first asked.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// About 1/20 s worth of tokens at the full rate, at least one, at most a quarter of the burst.
fn lease_size(per_second: u32, burst: u32) -> u32 {
    (per_second / 20)
        .min(burst / MAX_LEASE_SHARE_OF_BURST)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::lease_size;

    #[test]
    fn slow_keys_lease_one_token_and_fast_keys_a_twentieth_of_a_second() {
        assert_eq!(lease_size(2, 5), 1);
        assert_eq!(lease_size(50, 100), 2);
        assert_eq!(lease_size(1000, 2000), 50);
        assert_eq!(lease_size(1000, 8), 2);
    }
}
