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

/// Real-time admission in Redis, a cache of the ledger: each team's balance and what is
/// reserved against it, changed only by one Lua script at a time. A reservation expires on
/// its own (a sorted set of expiry times), so a crashed caller cannot hold credits forever.
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
}

// KEYS: balance hash, reservations zset. ARGV: id, amount, ttl ms.
// Returns 1 admitted, 0 refused, -1 when the team's balance is not cached.
const RESERVE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms)) do
  local amount = tonumber(string.match(member, ':(%-?%d+)$'))
  redis.call('HINCRBY', KEYS[1], 'reserved', -amount)
  redis.call('ZREM', KEYS[2], member)
end
local balance = tonumber(redis.call('HGET', KEYS[1], 'balance') or '0')
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved') or '0')
local amount = tonumber(ARGV[2])
if balance - reserved < amount then return 0 end
redis.call('HINCRBY', KEYS[1], 'reserved', amount)
redis.call('ZADD', KEYS[2], now_ms + tonumber(ARGV[3]), ARGV[1] .. ':' .. ARGV[2])
return 1
";

// Caches a balance read from the ledger, with what live reservations still hold.
// KEYS: balance hash, reservations zset. ARGV: balance, ttl seconds.
const LOAD: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
local reserved = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  reserved = reserved + tonumber(string.match(member, ':(%-?%d+)$'))
end
redis.call('HSET', KEYS[1], 'balance', ARGV[1], 'reserved', reserved)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
";

// KEYS: balance hash, reservations zset. ARGV: id, amount.
const RELEASE: &str = r"
if redis.call('ZREM', KEYS[2], ARGV[1] .. ':' .. ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'reserved', -tonumber(ARGV[2]))
end
return 1
";

/// How long a team's cached balance lives before it is read again from the ledger.
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

    fn keys(&self, team_id: Uuid) -> (String, String) {
        (
            format!("{}{team_id}", self.prefix),
            format!("{}{team_id}:reservations", self.prefix),
        )
    }

    /// Reserves `amount` for `id` during `ttl_ms`, loading the balance from the ledger
    /// when Redis does not have it (after a flush or a restart).
    pub async fn reserve(
        &self,
        db: &sqlx::PgPool,
        team_id: Uuid,
        id: Uuid,
        amount: i64,
        ttl_ms: u64,
    ) -> anyhow::Result<Admitted> {
        let (balance, reservations) = self.keys(team_id);
        for _ in 0..2 {
            let answer: i64 = self
                .reserve
                .key(&balance)
                .key(&reservations)
                .arg(id.to_string())
                .arg(amount)
                .arg(ttl_ms)
                .invoke_async(&mut self.redis.clone())
                .await?;
            match answer {
                1 => return Ok(Admitted::Yes),
                0 => return Ok(Admitted::InsufficientCredits),
                _ => self.load(db, team_id).await?,
            }
        }
        anyhow::bail!("the team's balance could not be cached")
    }

    pub async fn release(&self, team_id: Uuid, id: Uuid, amount: i64) -> anyhow::Result<()> {
        let (balance, reservations) = self.keys(team_id);
        let _: i64 = self
            .release
            .key(&balance)
            .key(&reservations)
            .arg(id.to_string())
            .arg(amount)
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(())
    }

    /// After a charge booked in the ledger: the cached balance follows (when cached).
    pub async fn charged(&self, team_id: Uuid, amount: i64) -> anyhow::Result<()> {
        let (balance, _) = self.keys(team_id);
        let mut redis = self.redis.clone();
        let cached: bool = redis::AsyncCommands::exists(&mut redis, &balance).await?;
        if cached {
            let _: i64 =
                redis::AsyncCommands::hincr(&mut redis, &balance, "balance", -amount).await?;
        }
        Ok(())
    }

    /// Drops the cached balance (after a grant): the next reservation reads the ledger.
    pub async fn forget(&self, team_id: Uuid) -> anyhow::Result<()> {
        let (balance, _) = self.keys(team_id);
        let _: i64 = redis::AsyncCommands::del(&mut self.redis.clone(), &balance).await?;
        Ok(())
    }

    async fn load(&self, db: &sqlx::PgPool, team_id: Uuid) -> anyhow::Result<()> {
        let mut connection = db.acquire().await?;
        let available = sandbase_billing::balance(&mut connection, team_id)
            .await?
            .available;
        let (balance, reservations) = self.keys(team_id);
        let _: i64 = self
            .load
            .key(&balance)
            .key(&reservations)
            .arg(available.0)
            .arg(CACHE_SECS)
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(())
    }
}

/// How much runtime is charged at once, at least.
const CHARGE_EVERY_SECS: f64 = 5.0;

/// Charges sandboxes' runtime to the ledger: running ones every few seconds, stopped ones up
/// to when they stopped. Each charge is idempotent (keyed by the sandbox and the start of
/// the charged interval) and names the sandbox, the seconds and the price, so every debit is
/// traceable to the usage it came from.
pub async fn meter(state: &crate::state::AppState) -> anyhow::Result<()> {
    type Row = (
        Uuid,
        Uuid,
        i32,
        i32,
        chrono::DateTime<Utc>,
        chrono::DateTime<Utc>,
    );
    let mut transaction = state.db.begin().await?;
    let due: Vec<Row> = sqlx::query_as(
        "SELECT id, team_id, cpu_millis, memory_mb, charged_until, \
                CASE WHEN state = 'stopped' THEN stopped_at ELSE now() END \
         FROM sandboxes \
         WHERE (state = 'running' AND charged_until <= now() - make_interval(secs => $1)) \
            OR (state = 'stopped' AND stop_reason <> 'failed' AND charged_until < stopped_at) \
         ORDER BY charged_until LIMIT 200 FOR UPDATE SKIP LOCKED",
    )
    .bind(CHARGE_EVERY_SECS)
    .fetch_all(&mut *transaction)
    .await?;
    let mut charged = Vec::new();
    for (id, team_id, cpu_millis, memory_mb, from, until) in due {
        let milliseconds = (until - from).num_milliseconds().max(0);
        let resources = sandbase_api::sandboxes::Resources {
            cpu_millis: cpu_millis as u32,
            memory_mb: memory_mb as u32,
            disk_mb: 0,
            pids: 0,
        };
        let per_second = price_per_second(resources, &state.settings.billing);
        let amount = (per_second.max(0) as u128 * milliseconds as u128).div_ceil(1000) as i64;
        if amount > 0 {
            let booked = sandbase_billing::debit(
                &mut transaction,
                sandbase_billing::Debit {
                    team_id,
                    amount: Credits(amount),
                    idempotency_key: format!("runtime:{id}:{}", from.timestamp_millis()),
                    description: "sandbox runtime".to_owned(),
                    details: serde_json::json!({
                        "kind": "runtime",
                        "sandbox": id,
                        "from": from,
                        "until": until,
                        "milliseconds": milliseconds,
                        "vcpu_millis": cpu_millis,
                        "memory_mb": memory_mb,
                        "price_per_second_micro": per_second,
                    }),
                },
            )
            .await?;
            if booked.is_some() {
                charged.push((team_id, amount));
            }
        }
        sqlx::query("UPDATE sandboxes SET charged_until = $2 WHERE id = $1")
            .bind(id)
            .bind(until)
            .execute(&mut *transaction)
            .await?;
    }
    transaction.commit().await?;
    for (team_id, amount) in charged {
        state.admission.charged(team_id, amount).await?;
    }
    Ok(())
}

/// Teams at zero (or below) with running sandboxes: after `billing.grace_secs`, their
/// sandboxes stop, with the reason on each sandbox and in the audit log.
pub async fn stop_when_exhausted(state: &crate::state::AppState) -> anyhow::Result<()> {
    let teams: Vec<(Uuid,)> =
        sqlx::query_as("SELECT DISTINCT team_id FROM sandboxes WHERE state = 'running'")
            .fetch_all(&state.db)
            .await?;
    let mut redis = state.redis.clone();
    for (team_id,) in teams {
        let mut connection = state.db.acquire().await?;
        let available = sandbase_billing::balance(&mut connection, team_id)
            .await?
            .available;
        drop(connection);
        let key = format!("{}exhausted:{team_id}", state.settings.redis.key_prefix);
        if available.0 > 0 {
            let _: i64 = redis::AsyncCommands::del(&mut redis, &key).await?;
            continue;
        }
        let now = Utc::now().timestamp_millis();
        let first: bool = redis::AsyncCommands::set_nx(&mut redis, &key, now).await?;
        if first {
            // The ledger says zero: admissions read it again rather than a cached balance.
            state.admission.forget(team_id).await?;
        }
        let since: i64 = redis::AsyncCommands::get(&mut redis, &key).await?;
        if now - since < state.settings.billing.grace_secs as i64 * 1000 {
            continue;
        }
        let mut transaction = state.db.begin().await?;
        let stopped: Vec<(Uuid, Uuid, Option<String>)> = sqlx::query_as(
            "UPDATE sandboxes SET state = 'stopped', stop_reason = 'insufficient_credits', stopped_at = now() \
             WHERE team_id = $1 AND state = 'running' RETURNING id, team_id, worker_id",
        )
        .bind(team_id)
        .fetch_all(&mut *transaction)
        .await?;
        let pairs: Vec<(Uuid, Uuid)> = stopped.iter().map(|(id, team, _)| (*id, *team)).collect();
        crate::sandboxes::record_system_stops(
            &mut transaction,
            &pairs,
            "sandbox.stop_insufficient_credits",
            "the team's credits ran out and the grace period passed",
        )
        .await?;
        transaction.commit().await?;
        for (id, _, worker_id) in stopped {
            state.routes.forget(id);
            if let Some(worker_id) = worker_id {
                crate::sandboxes::remove_on_worker(state, &worker_id, id).await;
            }
        }
    }
    Ok(())
}
