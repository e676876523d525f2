//! What one sandbox may ask of the proxy per second, and what the proxy holds at once: token
//! buckets per sandbox for DNS queries and new connections, and a budget of connections for
//! the whole process (its file descriptors) that no sandbox can take all of.

use std::sync::Mutex;
use std::time::Instant;

/// DNS queries a sandbox may send per second, and in a burst.
pub const DNS_PER_SECOND: f64 = 50.0;
pub const DNS_BURST: f64 = 200.0;
/// New connections a sandbox may open per second, and in a burst.
pub const CONNECTIONS_PER_SECOND: f64 = 30.0;
pub const CONNECTIONS_BURST: f64 = 120.0;
/// File descriptors a relayed connection may hold (both sockets, two pipes of two ends).
pub const DESCRIPTORS_PER_CONNECTION: u64 = 6;

/// A token bucket: `rate` tokens a second up to `burst`.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(rate: f64, burst: f64) -> Bucket {
        Bucket {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes a token when there is one.
    pub fn take(&self) -> bool {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (tokens, last) = *state;
        let now = Instant::now();
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * self.rate).min(self.burst);
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            true
        } else {
            *state = (tokens, now);
            false
        }
    }
}

/// Raises this process's open-file limit to its hard limit; returns the limit now in force.
pub fn raise_open_files() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(1 << 20)
}

/// How many connections the proxy carries at once with `open_files` descriptors (a quarter
/// kept for listeners, DNS, logs and the worker's pipe).
pub fn connection_budget(open_files: u64) -> usize {
    usize::try_from(open_files * 3 / 4 / DESCRIPTORS_PER_CONNECTION)
        .unwrap_or(usize::MAX)
        .max(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let bucket = Bucket::new(10.0, 5.0);
        let taken = (0..100).filter(|_| bucket.take()).count();
        assert_eq!(taken, 5);
        std::thread::sleep(std::time::Duration::from_millis(250));
        let again = (0..100).filter(|_| bucket.take()).count();
        assert!((2..=4).contains(&again), "{again}");
        assert_eq!(connection_budget(1024), 128);
        assert_eq!(connection_budget(10), 64);
    }
}
