//! The gateway's use of the ledger: starter credits for new teams and grant expiry.

use chrono::{Duration, Utc};
use sandbase_billing::{Credits, GrantSource, NewGrant};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::config::BillingSettings;

/// Grants a new team its starter credits (in the sign-up's own transaction).
pub async fn grant_starter(
    connection: &mut PgConnection,
    team_id: Uuid,
    settings: &BillingSettings,
) -> Result<(), sqlx::Error> {
    let amount = Credits::parse(&settings.starter_credits).unwrap_or_default();
    if amount.0 <= 0 {
        return Ok(());
    }
    let expires_at = (settings.starter_expiry_days > 0)
        .then(|| Utc::now() + Duration::days(i64::from(settings.starter_expiry_days)));
    sandbase_billing::grant(
        connection,
        NewGrant {
            team_id,
            source: GrantSource::Starter,
            amount,
            priority: 0,
            effective_at: None,
            expires_at,
            idempotency_key: format!("starter:{team_id}"),
            description: "starter credits".to_owned(),
            details: serde_json::json!({}),
        },
    )
    .await?;
    Ok(())
}

/// Micro-credits per second of a sandbox of this size (each part rounded up).
pub fn price_per_second(
    resources: sandbase_api::sandboxes::Resources,
    settings: &BillingSettings,
) -> i64 {
    let cpu = (u64::from(resources.cpu_millis) * settings.vcpu_second_micro).div_ceil(1000);
    let memory = (u64::from(resources.memory_mb) * settings.gib_second_micro).div_ceil(1024);
    (cpu + memory) as i64
}

/// Micro-credits per second of a paused sandbox of this size: its memory only.
pub fn paused_price_per_second(
    resources: sandbase_api::sandboxes::Resources,
    settings: &BillingSettings,
) -> i64 {
    (u64::from(resources.memory_mb) * settings.paused_gib_second_micro).div_ceil(1024) as i64
}

/// Real-time admission in Redis, a cache of the ledger. A budget is a balance and what is
/// reserved against it, changed only by one Lua script at a time: the team's credits, and
/// the spend cap of the API key that asks (if it has one). A reservation expires on its own
/// (a sorted set of expiry times), so a crashed caller cannot hold credits forever.
pub struct Admission {
    redis: redis::aio::ConnectionManager,
    prefix: String,
    reserve: redis::Script,
    release: redis::Script,
    load: redis::Script,
}

/// What a reservation found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    Yes,
    InsufficientCredits,
    /// The API key's spend cap is reached.
    KeyCapReached,
    /// The sandbox's spend cap is reached.
    SandboxCapReached,
}

/// Whose budget: a team's credits, an API key's cap or a sandbox's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budget {
    Team(Uuid),
    Cap(Cap),
}

/// A spend cap a reservation counts against besides the team's credits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// An API key's `max_credits`.
    Key(Uuid),
    /// A sandbox's `max_credits` (its store calls from inside).
    Sandbox(Uuid),
}

impl Cap {
    /// The caps of a key and its ancestors.
    pub fn keys(keys: &[Uuid]) -> Vec<Cap> {
        keys.iter().copied().map(Cap::Key).collect()
    }
}

// KEYS: (hash, zset) per budget. ARGV: id, amount, ttl ms.
// Returns 0 when every budget admits (and reserves in each), k when budget k refuses, -k
// when budget k is not cached. A budget with `uncapped` set admits anything.
const RESERVE: &str = r"
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local amount = tonumber(ARGV[2])
local budgets = #KEYS / 2
local capped = {}
for k = 1, budgets do
  local hash, zset = KEYS[2 * k - 1], KEYS[2 * k]
  if redis.call('EXISTS', hash) == 0 then return -k end
  capped[k] = redis.call('HGET', hash, 'uncapped') ~= '1'
  if capped[k] then
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', zset, '-inf', now_ms)) do
      redis.call('HINCRBY', hash, 'reserved', -tonumber(string.match(member, ':(%-?%d+)$')))
      redis.call('ZREM', zset, member)
    end
    local balance = tonumber(redis.call('HGET', hash, 'balance') or '0')
    local reserved = tonumber(redis.call('HGET', hash, 'reserved') or '0')
    if balance - reserved < amount then return k end
  end
end
for k = 1, budgets do
  if capped[k] then
    redis.call('HINCRBY', KEYS[2 * k - 1], 'reserved', amount)
    redis.call('ZADD', KEYS[2 * k], now_ms + tonumber(ARGV[3]), ARGV[1] .. ':' .. ARGV[2])
  end
end
return 0
";

// Caches a budget read from PostgreSQL, with what live reservations still hold.
// KEYS: hash, zset. ARGV: balance, ttl seconds, uncapped (0 or 1).
const LOAD: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
local reserved = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  reserved = reserved + tonumber(string.match(member, ':(%-?%d+)$'))
end
redis.call('HSET', KEYS[1], 'balance', ARGV[1], 'reserved', reserved, 'uncapped', ARGV[3])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
";

// KEYS: (hash, zset) per budget. ARGV: id, amount.
const RELEASE: &str = r"
for k = 1, #KEYS / 2 do
  if redis.call('ZREM', KEYS[2 * k], ARGV[1] .. ':' .. ARGV[2]) == 1 then
    redis.call('HINCRBY', KEYS[2 * k - 1], 'reserved', -tonumber(ARGV[2]))
  end
end
return 1
";

/// How long a cached budget lives before it is read again from PostgreSQL.
const CACHE_SECS: i64 = 60;

impl Admission {
    pub fn new(redis: redis::aio::ConnectionManager, key_prefix: &str) -> Admission {
        Admission {
            redis,
            prefix: format!("{key_prefix}credits:"),
            reserve: redis::Script::new(RESERVE),
            release: redis::Script::new(RELEASE),
            load: redis::Script::new(LOAD),
        }
    }

    fn keys(&self, budget: Budget) -> (String, String) {
        let name = match budget {
            Budget::Team(id) => id.to_string(),
            Budget::Cap(Cap::Key(id)) => format!("key:{id}"),
            Budget::Cap(Cap::Sandbox(id)) => format!("sandbox:{id}"),
        };
        (
            format!("{}{name}", self.prefix),
            format!("{}{name}:reservations", self.prefix),
        )
    }

    fn budgets(team_id: Uuid, caps: &[Cap]) -> Vec<Budget> {
        let mut budgets = vec![Budget::Team(team_id)];
        budgets.extend(caps.iter().copied().map(Budget::Cap));
        budgets
    }

    /// Reserves `amount` for `id` during `ttl_ms` against the team's credits and `caps`
    /// (the API key that asks and its ancestors, a sandbox), loading a budget from
    /// PostgreSQL when Redis does not have it (after a flush or a restart).
    pub async fn reserve(
        &self,
        db: &sqlx::PgPool,
        team_id: Uuid,
        caps: &[Cap],
        id: Uuid,
        amount: i64,
        ttl_ms: u64,
    ) -> anyhow::Result<Admitted> {
        let budgets = Self::budgets(team_id, caps);
        for _ in 0..=budgets.len() {
            let mut invocation = self.reserve.prepare_invoke();
            for budget in &budgets {
                let (hash, zset) = self.keys(*budget);
                invocation.key(hash).key(zset);
            }
            let answer: i64 = invocation
                .arg(id.to_string())
                .arg(amount)
                .arg(ttl_ms)
                .invoke_async(&mut self.redis.clone())
                .await?;
            match answer {
                0 => return Ok(Admitted::Yes),
                k if k > 0 => {
                    return Ok(match budgets[k as usize - 1] {
                        Budget::Team(_) => Admitted::InsufficientCredits,
                        Budget::Cap(Cap::Key(_)) => Admitted::KeyCapReached,
                        Budget::Cap(Cap::Sandbox(_)) => Admitted::SandboxCapReached,
                    });
                }
                k => self.load(db, budgets[(-k) as usize - 1]).await?,
            }
        }
        anyhow::bail!("the budgets could not be cached")
    }

    pub async fn release(
        &self,
        team_id: Uuid,
        caps: &[Cap],
        id: Uuid,
        amount: i64,
    ) -> anyhow::Result<()> {
        let mut invocation = self.release.prepare_invoke();
        for budget in Self::budgets(team_id, caps) {
            let (hash, zset) = self.keys(budget);
            invocation.key(hash).key(zset);
        }
        let _: i64 = invocation
            .arg(id.to_string())
            .arg(amount)
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(())
    }

    /// After a charge booked in the ledger: the cached budgets of the team and of `caps`
    /// (the key charged and its ancestors, the sandbox) follow (when cached).
    pub async fn charged(&self, team_id: Uuid, caps: &[Cap], amount: i64) -> anyhow::Result<()> {
        let mut redis = self.redis.clone();
        for budget in Self::budgets(team_id, caps) {
            let (hash, _) = self.keys(budget);
            let cached: bool = redis::AsyncCommands::exists(&mut redis, &hash).await?;
            if cached {
                let _: i64 =
                    redis::AsyncCommands::hincr(&mut redis, &hash, "balance", -amount).await?;
            }
        }
        Ok(())
    }

    /// What the team's live reservations hold.
    pub async fn reserved(&self, team_id: Uuid) -> anyhow::Result<i64> {
        let (_, reservations) = self.keys(Budget::Team(team_id));
        let now_ms = Utc::now().timestamp_millis();
        let live: Vec<String> = redis::AsyncCommands::zrangebyscore(
            &mut self.redis.clone(),
            &reservations,
            now_ms,
            "+inf",
        )
        .await?;
        Ok(live
            .iter()
            .filter_map(|member| member.rsplit_once(':'))
            .filter_map(|(_, amount)| amount.parse::<i64>().ok())
            .sum())
    }

    /// Drops a cap's cached headroom (after the cap changed): the next reservation reads it.
    pub async fn forget_cap(&self, cap: Cap) -> anyhow::Result<()> {
        let (headroom, _) = self.keys(Budget::Cap(cap));
        let _: i64 = redis::AsyncCommands::del(&mut self.redis.clone(), &headroom).await?;
        Ok(())
    }

    /// Drops the team's cached balance (after a grant): the next reservation reads the ledger.
    pub async fn forget(&self, team_id: Uuid) -> anyhow::Result<()> {
        let (balance, _) = self.keys(Budget::Team(team_id));
        let _: i64 = redis::AsyncCommands::del(&mut self.redis.clone(), &balance).await?;
        Ok(())
    }

    async fn load(&self, db: &sqlx::PgPool, budget: Budget) -> anyhow::Result<()> {
        let (balance, uncapped) = match budget {
            Budget::Team(team_id) => {
                let mut connection = db.acquire().await?;
                let available = sandbase_billing::balance(&mut connection, team_id)
                    .await?
                    .available;
                (available.0, false)
            }
            Budget::Cap(cap) => {
                let (table, id) = match cap {
                    Cap::Key(id) => ("api_keys", id),
                    Cap::Sandbox(id) => ("sandboxes", id),
                };
                let row: Option<(Option<i64>, i64)> = sqlx::query_as(&format!(
                    "SELECT max_credits, spent_micro FROM {table} WHERE id = $1"
                ))
                .bind(id)
                .fetch_optional(db)
                .await?;
                match row {
                    Some((Some(cap), spent)) => (cap - spent, false),
                    _ => (0, true),
                }
            }
        };
        let (hash, zset) = self.keys(budget);
        let _: i64 = self
            .load
            .key(&hash)
            .key(&zset)
            .arg(balance)
            .arg(CACHE_SECS)
            .arg(i64::from(uncapped))
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(())
    }
}
