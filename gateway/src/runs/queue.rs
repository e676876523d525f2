//! The fair run queue in Redis: a list per team and a ring of teams with queued runs,
//! served round robin, so one team's thousand runs do not starve another's one.

use redis::Script;
use tokio::sync::Notify;
use uuid::Uuid;

/// The fair queue in Redis.
pub struct RunQueue {
    redis: redis::aio::ConnectionManager,
    prefix: String,
    push: Script,
    pop: Script,
    requeue: Script,
    /// Woken when a run is queued here or room may have appeared.
    pub wake: Notify,
}

// KEYS: ring, active set, ids set, team list. ARGV: team, run.
const PUSH: &str = r"
redis.call('RPUSH', KEYS[4], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[2])
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[1], ARGV[1])
end
return 1
";

// KEYS: ring, active set, ids set. ARGV: team-list key prefix.
const POP: &str = r"
local team = redis.call('LPOP', KEYS[1])
if not team then return false end
local list = ARGV[1] .. team
local run = redis.call('LPOP', list)
if redis.call('LLEN', list) > 0 then
  redis.call('RPUSH', KEYS[1], team)
else
  redis.call('SREM', KEYS[2], team)
end
if not run then return false end
redis.call('SREM', KEYS[3], run)
return {team, run}
";

// Back to the front of its team's list. KEYS: ring, active set, ids set, team list.
const REQUEUE: &str = r"
redis.call('LPUSH', KEYS[4], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[2])
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[1], ARGV[1])
end
return 1
";

impl RunQueue {
    pub fn new(redis: redis::aio::ConnectionManager, key_prefix: &str) -> RunQueue {
        RunQueue {
            redis,
            prefix: format!("{key_prefix}runq:"),
            push: Script::new(PUSH),
            pop: Script::new(POP),
            requeue: Script::new(REQUEUE),
            wake: Notify::new(),
        }
    }

    fn keys(&self, team: Uuid) -> [String; 4] {
        [
            format!("{}ring", self.prefix),
            format!("{}active", self.prefix),
            format!("{}ids", self.prefix),
            format!("{}team:{team}", self.prefix),
        ]
    }

    /// Queues a run at the back of its team's list.
    pub async fn push(&self, team: Uuid, run: Uuid) -> redis::RedisResult<()> {
        self.invoke(&self.push, team, run).await
    }

    /// Puts a run back at the front of its team's list (it was taken, but found no room).
    pub async fn push_front(&self, team: Uuid, run: Uuid) -> redis::RedisResult<()> {
        self.invoke(&self.requeue, team, run).await
    }

    async fn invoke(&self, script: &Script, team: Uuid, run: Uuid) -> redis::RedisResult<()> {
        let mut invocation = script.prepare_invoke();
        for key in self.keys(team) {
            invocation.key(key);
        }
        let _: i64 = invocation
            .arg(team.to_string())
            .arg(run.to_string())
            .invoke_async(&mut self.redis.clone())
            .await?;
        self.wake.notify_waiters();
        Ok(())
    }

    /// The next run, round robin between teams.
    pub async fn pop(&self) -> redis::RedisResult<Option<(Uuid, Uuid)>> {
        let [ring, active, ids, _] = self.keys(Uuid::nil());
        let popped: Option<(String, String)> = self
            .pop
            .key(ring)
            .key(active)
            .key(ids)
            .arg(format!("{}team:", self.prefix))
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(popped.and_then(|(team, run)| Some((team.parse().ok()?, run.parse().ok()?))))
    }

    /// Whether the run is in Redis (queued runs are put back after a flush).
    pub async fn contains(&self, run: Uuid) -> redis::RedisResult<bool> {
        let [_, _, ids, _] = self.keys(Uuid::nil());
        redis::cmd("SISMEMBER")
            .arg(ids)
            .arg(run.to_string())
            .query_async(&mut self.redis.clone())
            .await
    }
}
