//! Per-key rate limiting in Redis with GCRA (the generic cell rate algorithm), in one
//! atomic Lua script using Redis' own clock, so every gateway shares one limit.

use redis::Script;

/// GCRA. KEYS[1]: the limiter's key. ARGV[1]: emission interval in microseconds (1 s / rate).
/// ARGV[2]: burst (requests that may arrive at once). Returns {allowed, retry_after_us, remaining}.
const GCRA: &str = r#"
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + interval
local capacity = interval * burst
local ahead = new_tat - now
if ahead > capacity then
  return {0, ahead - capacity, 0}
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil(ahead / 1000) + 1)
return {1, 0, math.floor((capacity - ahead) / interval)}
"#;

#[derive(Clone)]
pub struct RateLimiter {
    script: std::sync::Arc<Script>,
    prefix: String,
}

/// The result of one admission check.
#[derive(Debug, Clone, Copy)]
pub enum Decision {
    Allowed { remaining: u64 },
    Limited { retry_after_secs: u64 },
}

impl RateLimiter {
    pub fn new(prefix: &str) -> Self {
        RateLimiter {
            script: std::sync::Arc::new(Script::new(GCRA)),
            prefix: format!("{prefix}rl:"),
        }
    }

    /// Counts one request against `subject` at `per_second` sustained, `burst` at once.
    pub async fn check(
        &self,
        redis: &mut redis::aio::ConnectionManager,
        subject: &str,
        per_second: u32,
        burst: u32,
    ) -> redis::RedisResult<Decision> {
        let interval_us = 1_000_000u64 / u64::from(per_second.max(1));
        let (allowed, retry_after_us, remaining): (i64, i64, i64) = self
            .script
            .key(format!("{}{subject}", self.prefix))
            .arg(interval_us.max(1))
            .arg(burst.max(1))
            .invoke_async(redis)
            .await?;
        if allowed == 1 {
            Ok(Decision::Allowed {
                remaining: remaining.max(0) as u64,
            })
        } else {
            // Retry-After is in whole seconds; round up so a client that obeys it is admitted.
            let retry_after_secs = (retry_after_us.max(0) as u64).div_ceil(1_000_000).max(1);
            Ok(Decision::Limited { retry_after_secs })
        }
    }
}
