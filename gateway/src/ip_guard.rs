//! What one address may ask of this gateway before anybody knows who it is: requests at a
//! sustained rate (with a burst), and failed authentications at a much lower one. Both are
//! kept in this process's memory (GCRA, one timestamp per address), so a flood is turned away
//! without a Redis or Postgres round trip; each gateway of a deployment counts its own. An
//! IPv6 /64 counts as one address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shards of each table, so concurrent requests rarely wait on one lock.
const SHARDS: usize = 16;
/// Entries per shard before the expired ones are swept.
const SWEEP_AT: usize = 4096;

/// The per-address limits of one gateway.
pub struct IpGuard {
    requests: Option<Gcra>,
    failures: Option<Gcra>,
    /// Postgres reads for credentials presented by addresses that spent their failures, for
    /// the whole gateway (one key): a flood of made-up keys from them costs at most this.
    shut_out_lookups: Gcra,
}

/// Reads a second (burst twice that) for the credentials of shut-out addresses.
const SHUT_OUT_LOOKUPS_PER_SECOND: u32 = 10;

impl IpGuard {
    /// `requests_per_second`/`burst` for every request, `failures_per_minute` for failed
    /// authentications; a zero rate turns that limit off.
    pub fn new(requests_per_second: u32, burst: u32, failures_per_minute: u32) -> IpGuard {
        IpGuard {
            requests: (requests_per_second > 0)
                .then(|| Gcra::new(Duration::from_secs(1) / requests_per_second, burst.max(1))),
            failures: (failures_per_minute > 0).then(|| {
                Gcra::new(
                    Duration::from_secs(60) / failures_per_minute,
                    failures_per_minute,
                )
            }),
            shut_out_lookups: Gcra::new(
                Duration::from_secs(1) / SHUT_OUT_LOOKUPS_PER_SECOND,
                2 * SHUT_OUT_LOOKUPS_PER_SECOND,
            ),
        }
    }

    /// Counts a request; `Err(retry after, in seconds)` past the address's rate.
    pub fn admit_request(&self, ip: IpAddr) -> Result<(), u64> {
        match &self.requests {
            Some(gcra) => gcra.take(key(ip)),
            None => Ok(()),
        }
    }

    /// Whether the address has failed authentications left (`Err(retry after)` once it has
    /// used them); counts nothing. A shut-out address's credentials are still checked (a
    /// valid key behind a shared proxy must pass), but its failures are refused with 429
    /// and its cache misses go through [`IpGuard::may_look_up`].
    pub fn may_fail(&self, ip: IpAddr) -> Result<(), u64> {
        match &self.failures {
            Some(gcra) => gcra.peek(key(ip)),
            None => Ok(()),
        }
    }

    /// Whether a credential of a shut-out address may be read from Postgres now.
    pub fn may_look_up(&self) -> Result<(), u64> {
        self.shut_out_lookups.take(0)
    }

    /// Counts a failed authentication from the address.
    pub fn failed(&self, ip: IpAddr) {
        if let Some(gcra) = &self.failures {
            let _ = gcra.take(key(ip));
        }
    }
}

/// An IPv4 address, or an IPv6 address's /64.
fn key(ip: IpAddr) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6) & !u128::from(u64::MAX) | 1 << 127,
    }
}

/// The generic cell rate algorithm: one "theoretical arrival time" per key.
struct Gcra {
    interval: Duration,
    /// How far ahead of now the arrival time may run: (burst - 1) intervals.
    tolerance: Duration,
    shards: Vec<Mutex<HashMap<u128, Instant>>>,
}

impl Gcra {
    fn new(interval: Duration, burst: u32) -> Gcra {
        Gcra {
            interval,
            tolerance: interval * (burst - 1),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn shard(&self, key: u128) -> std::sync::MutexGuard<'_, HashMap<u128, Instant>> {
        let index = (key ^ (key >> 64)) as usize % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn take(&self, key: u128) -> Result<(), u64> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let arrival = shard.get(&key).copied().unwrap_or(now).max(now);
        if arrival > now + self.tolerance {
            return Err(retry_after(arrival - self.tolerance - now));
        }
        if shard.len() >= SWEEP_AT {
            shard.retain(|_, arrival| *arrival > now);
        }
        shard.insert(key, arrival + self.interval);
        Ok(())
    }

    fn peek(&self, key: u128) -> Result<(), u64> {
        let now = Instant::now();
        match self.shard(key).get(&key) {
            Some(arrival) if *arrival > now + self.tolerance => {
                Err(retry_after(*arrival - self.tolerance - now))
            }
            _ => Ok(()),
        }
    }
}

fn retry_after(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_burst_then_waits_and_others_are_unaffected() {
        let guard = IpGuard::new(1, 3, 0);
        let one: IpAddr = "203.0.113.1".parse().unwrap();
        let other: IpAddr = "203.0.113.2".parse().unwrap();
        for _ in 0..3 {
            assert!(guard.admit_request(one).is_ok());
        }
        assert_eq!(guard.admit_request(one), Err(1));
        assert!(guard.admit_request(other).is_ok());
    }

    #[test]
    fn failures_close_authentication_for_the_address_and_its_slash_64() {
        let guard = IpGuard::new(0, 0, 2);
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let neighbour: IpAddr = "2001:db8:1:2::ffff".parse().unwrap();
        let elsewhere: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(guard.may_fail(one).is_ok());
        guard.failed(one);
        assert!(guard.may_fail(one).is_ok());
        guard.failed(neighbour);
        assert!(guard.may_fail(one).is_err());
        assert!(guard.may_fail(neighbour).is_err());
        assert!(guard.may_fail(elsewhere).is_ok());
        // Requests are unlimited with a zero rate.
        assert!(guard.admit_request(one).is_ok());
    }
}
