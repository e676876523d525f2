//! Runs: "files in, command, files out" in a sandbox of its own.
//!
//! A run is a row in PostgreSQL (the truth) and an id in a Redis queue that is fair between
//! teams: each team has its own list, and a ring of teams with queued runs is served round
//! robin, so one team's thousand runs do not starve another's one. Every gateway runs a
//! dispatcher that takes the next run only when some worker has room, claims it in
//! PostgreSQL, and carries it out: a sandbox, the inputs unpacked into `/work/in` (owned
//! by the sandbox's root, read-only to the command), the command as the sandbox user, the
//! outputs directory archived into the artifact store, the sandbox destroyed. A run whose
//! worker turns out full goes back to the front of its team's queue. The queue is a cache:
//! queued runs missing from Redis (after a flush) are put back from PostgreSQL.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use redis::Script;
use sandbase_api::internal::Exec;
use sandbase_api::runs::{Run, RunState};
use sandbase_api::sandboxes::{ExecResult, Resources, RunAs};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Notify, Semaphore};
use uuid::Uuid;

use crate::error::ApiError;
use crate::sandboxes::{self, Owner, Placement};
use crate::state::AppState;

/// Output of the command kept on the run (each stream).
const KEPT_OUTPUT: usize = 64 * 1024;
/// How long a claimed run's lease lasts; renewed while it runs.
const LEASE_SECS: f64 = 30.0;
/// How often queued runs missing from Redis are looked for.
const REQUEUE_EVERY: Duration = Duration::from_secs(10);

pub const RUN_COLUMNS: &str = "id, template, argv, state, outputs, timeout_secs, cpu_millis, \
     memory_mb, disk_mb, pids, exit_code, timed_out, stdout, stderr, error, artifact_size, \
     created_at, started_at, finished_at, egress, credentials";

#[derive(sqlx::FromRow)]
pub struct RunRow {
    pub id: Uuid,
    pub template: String,
    pub argv: sqlx::types::Json<Vec<String>>,
    pub state: String,
    pub outputs: String,
    pub timeout_secs: i32,
    pub cpu_millis: i32,
    pub memory_mb: i32,
    pub disk_mb: i32,
    pub pids: i32,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    pub error: Option<String>,
    pub artifact_size: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub egress: Option<sqlx::types::Json<sandbase_api::sandboxes::EgressPolicy>>,
    pub credentials: Vec<String>,
}

impl RunRow {
    pub fn to_api(&self) -> Run {
        Run {
            id: self.id,
            template: self.template.clone(),
            cmd: self.argv.0.clone(),
            state: match self.state.as_str() {
                "queued" => RunState::Queued,
                "running" => RunState::Running,
                "completed" => RunState::Completed,
                _ => RunState::Failed,
            },
            outputs: self.outputs.clone(),
            timeout_secs: self.timeout_secs as u64,
            resources: Resources {
                cpu_millis: self.cpu_millis as u32,
                memory_mb: self.memory_mb as u32,
                disk_mb: self.disk_mb as u32,
                pids: self.pids as u32,
            },
            exit_code: self.exit_code,
            timed_out: self.timed_out,
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            error: self.error.clone(),
            artifact_size: self.artifact_size.map(|size| size as u64),
            egress: self.egress.as_ref().map(|policy| policy.0.clone()),
            credentials: self.credentials.clone(),
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
        }
    }
}

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

    pub async fn push(&self, team: Uuid, run: Uuid, front: bool) -> redis::RedisResult<()> {
        let script = if front { &self.requeue } else { &self.push };
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

    async fn contains(&self, run: Uuid) -> redis::RedisResult<bool> {
        let [_, _, ids, _] = self.keys(Uuid::nil());
        redis::cmd("SISMEMBER")
            .arg(ids)
            .arg(run.to_string())
            .query_async(&mut self.redis.clone())
            .await
    }
}

/// Where artifacts (and the inputs of queued runs) are kept: a local directory, or an
/// S3-compatible bucket when `runs.s3` is configured (every gateway then sees every run's
/// inputs and artifacts).
pub struct ArtifactStore {
    store: Arc<dyn ObjectStore>,
}

impl ArtifactStore {
    pub fn from_settings(settings: &crate::config::RunSettings) -> anyhow::Result<ArtifactStore> {
        let store: Arc<dyn ObjectStore> = match &settings.s3 {
            Some(s3) => {
                use secrecy::ExposeSecret;
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(&s3.bucket)
                    .with_region(&s3.region)
                    .with_allow_http(s3.allow_http);
                if let Some(endpoint) = &s3.endpoint {
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_virtual_hosted_style_request(false);
                }
                if let (Some(key), Some(secret)) = (&s3.access_key_id, &s3.secret_access_key) {
                    builder = builder
                        .with_access_key_id(key.expose_secret())
                        .with_secret_access_key(secret.expose_secret());
                }
                let bucket = builder.build().context("configuring runs.s3")?;
                Arc::new(object_store::prefix::PrefixStore::new(
                    bucket,
                    s3.prefix.as_str(),
                ))
            }
            None => {
                std::fs::create_dir_all(&settings.artifacts_dir).with_context(|| {
                    format!(
                        "creating runs.artifacts_dir {}",
                        settings.artifacts_dir.display()
                    )
                })?;
                Arc::new(
                    object_store::local::LocalFileSystem::new_with_prefix(&settings.artifacts_dir)
                        .context("opening runs.artifacts_dir")?,
                )
            }
        };
        Ok(ArtifactStore { store })
    }

    pub fn artifact(&self, team: Uuid, run: Uuid) -> StorePath {
        StorePath::from(format!("artifacts/{team}/{run}.tar"))
    }

    pub fn inputs(&self, team: Uuid, run: Uuid) -> StorePath {
        StorePath::from(format!("inputs/{team}/{run}.tar"))
    }

    pub async fn put(&self, key: &StorePath, bytes: Vec<u8>) -> anyhow::Result<()> {
        self.store
            .put(key, PutPayload::from(bytes))
            .await
            .with_context(|| format!("storing {key}"))?;
        Ok(())
    }

    /// A writer that uploads in parts as it goes (multipart on S3).
    pub fn writer(&self, key: StorePath) -> object_store::buffered::BufWriter {
        object_store::buffered::BufWriter::new(Arc::clone(&self.store), key)
    }

    /// The object's size and bytes, or `None` when there is none.
    pub async fn get(
        &self,
        key: &StorePath,
    ) -> anyhow::Result<
        Option<(
            u64,
            futures_util::stream::BoxStream<'static, object_store::Result<axum::body::Bytes>>,
        )>,
    > {
        match self.store.get(key).await {
            Ok(result) => Ok(Some((result.meta.size, result.into_stream()))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(anyhow::Error::new(error).context(format!("reading {key}"))),
        }
    }

    pub async fn read(&self, key: &StorePath) -> anyhow::Result<Option<Vec<u8>>> {
        let Some((size, mut stream)) = self.get(key).await? else {
            return Ok(None);
        };
        let mut bytes = Vec::with_capacity(size as usize);
        while let Some(chunk) = stream.next().await {
            bytes.extend_from_slice(&chunk?);
        }
        Ok(Some(bytes))
    }

    pub async fn delete(&self, key: &StorePath) {
        if let Err(error) = self.store.delete(key).await
            && !matches!(error, object_store::Error::NotFound { .. })
        {
            tracing::warn!(%key, error = %error, "removing a stored object failed");
        }
    }
}

/// The inputs of a run as one tar archive: the given archive, then the named files.
pub fn inputs_archive(
    files: &BTreeMap<String, String>,
    tar: Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, ApiError> {
    if files.is_empty() && tar.is_none() {
        return Ok(None);
    }
    let mut builder = tar::Builder::new(Vec::new());
    if let Some(tar) = tar {
        let mut archive = tar::Archive::new(tar.as_slice());
        let entries = archive
            .entries()
            .map_err(|error| ApiError::InvalidRequest(format!("`inputs.tar_base64`: {error}")))?;
        for entry in entries {
            let mut entry = entry.map_err(|error| {
                ApiError::InvalidRequest(format!("`inputs.tar_base64`: {error}"))
            })?;
            let header = entry.header().clone();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).map_err(|error| {
                ApiError::InvalidRequest(format!("`inputs.tar_base64`: {error}"))
            })?;
            builder
                .append(&header, data.as_slice())
                .map_err(anyhow::Error::from)?;
        }
    }
    for (path, content) in files {
        let clean = path.trim_start_matches("./");
        if clean.is_empty()
            || clean.starts_with('/')
            || clean.split('/').any(|part| part == ".." || part.is_empty())
        {
            return Err(ApiError::InvalidRequest(format!(
                "`inputs.files`: `{path}` must be a relative path inside /work/in"
            )));
        }
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(Utc::now().timestamp().max(0) as u64);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, clean, content.as_bytes())
            .map_err(|error| ApiError::InvalidRequest(format!("`inputs.files`: {error}")))?;
    }
    Ok(Some(builder.into_inner().map_err(anyhow::Error::from)?))
}

/// Every gateway's dispatcher: takes runs off the queue while workers have room.
pub async fn dispatch_forever(state: AppState, concurrency: Arc<Semaphore>) {
    // Runs taken off the queue whose sandbox is not placed yet: they will need room that
    // the workers' last heartbeats still show as free.
    let starting = Arc::new(AtomicUsize::new(0));
    let mut last_requeue = std::time::Instant::now() - REQUEUE_EVERY;
    loop {
        if last_requeue.elapsed() >= REQUEUE_EVERY {
            last_requeue = std::time::Instant::now();
            if let Err(error) = requeue_missing(&state).await {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "putting queued runs back failed"
                );
            }
        }
        let woken = state.run_queue.wake.notified();
        if !has_room(&state, starting.load(Ordering::Acquire)).await {
            let _ = tokio::time::timeout(Duration::from_millis(200), woken).await;
            continue;
        }
        let Ok(permit) = Arc::clone(&concurrency).acquire_owned().await else {
            return;
        };
        match state.run_queue.pop().await {
            Ok(Some((team, run))) => {
                let state = state.clone();
                starting.fetch_add(1, Ordering::AcqRel);
                let placing = Starting(Arc::clone(&starting));
                tokio::spawn(async move {
                    execute(&state, team, run, placing).await;
                    drop(permit);
                    state.run_queue.wake.notify_waiters();
                });
            }
            Ok(None) => {
                drop(permit);
                let _ = tokio::time::timeout(Duration::from_millis(200), woken).await;
            }
            Err(error) => {
                drop(permit);
                tracing::warn!(error = %error, "reading the run queue failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Whether the workers have more free places than runs already on their way to one.
async fn has_room(state: &AppState, starting: usize) -> bool {
    match state.workers.live().await {
        Ok(workers) => {
            let free: u64 = workers
                .iter()
                .map(|worker| u64::from(worker.capacity.saturating_sub(worker.running)))
                .sum();
            free > starting as u64
        }
        Err(_) => false,
    }
}

/// A run on its way to a sandbox; dropping it says the placement is over.
struct Starting(Arc<AtomicUsize>);

impl Drop for Starting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Queued runs older than a few seconds that Redis does not have (flushed, restarted).
async fn requeue_missing(state: &AppState) -> anyhow::Result<()> {
    let queued: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT id, team_id FROM runs WHERE state = 'queued' AND created_at < now() - interval '5 seconds' \
         ORDER BY created_at LIMIT 1000",
    )
    .fetch_all(&state.db)
    .await?;
    for (run, team) in queued {
        if !state.run_queue.contains(run).await? {
            tracing::info!(%run, "a queued run was missing from Redis; queued again");
            state.run_queue.push(team, run, false).await?;
        }
    }
    Ok(())
}

#[derive(sqlx::FromRow)]
struct Claimed {
    team_id: Uuid,
    api_key_id: Option<Uuid>,
    user_id: Option<Uuid>,
    template: String,
    argv: sqlx::types::Json<Vec<String>>,
    env: sqlx::types::Json<BTreeMap<String, String>>,
    outputs: String,
    timeout_secs: i32,
    cpu_millis: i32,
    memory_mb: i32,
    disk_mb: i32,
    pids: i32,
    has_inputs: bool,
    egress: Option<sqlx::types::Json<sandbase_api::sandboxes::EgressPolicy>>,
    credentials: Vec<String>,
}

/// Carries out one run taken off the queue.
async fn execute(state: &AppState, team: Uuid, run: Uuid, placing: Starting) {
    let claimed: Option<Claimed> = match sqlx::query_as(
        "UPDATE runs SET state = 'running', started_at = now(), lease_until = now() + make_interval(secs => $2) \
         WHERE id = $1 AND state = 'queued' \
         RETURNING team_id, api_key_id, user_id, template, argv, env, outputs, timeout_secs, \
                   cpu_millis, memory_mb, disk_mb, pids, has_inputs, egress, credentials",
    )
    .bind(run)
    .bind(LEASE_SECS)
    .fetch_optional(&state.db)
    .await
    {
        Ok(claimed) => claimed,
        Err(error) => {
            tracing::warn!(%run, error = %error, "claiming a run failed; queued again");
            let _ = state.run_queue.push(team, run, true).await;
            return;
        }
    };
    let Some(claimed) = claimed else {
        // Taken by another gateway, or no longer queued.
        return;
    };
    let renewal = {
        let state = state.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs_f64(LEASE_SECS / 3.0)).await;
                let _ = sqlx::query(
                    "UPDATE runs SET lease_until = now() + make_interval(secs => $2) WHERE id = $1 AND state = 'running'",
                )
                .bind(run)
                .bind(LEASE_SECS)
                .execute(&state.db)
                .await;
            }
        })
    };
    let outcome = carry_out(state, run, &claimed, placing).await;
    renewal.abort();
    let result = match outcome {
        Ok(Outcome::Done {
            exec,
            artifact_size,
        }) => {
            sqlx::query(
                "UPDATE runs SET state = 'completed', exit_code = $2, timed_out = $3, stdout = $4, \
                 stderr = $5, artifact_size = $6, finished_at = now(), lease_until = NULL WHERE id = $1",
            )
            .bind(run)
            .bind(exec.exit_code)
            .bind(exec.timed_out)
            .bind(truncate(&exec.stdout))
            .bind(truncate(&exec.stderr))
            .bind(artifact_size.map(|size| size as i64))
            .execute(&state.db)
            .await
        }
        Ok(Outcome::NoRoom) => {
            // Back to the front of its team's queue, to wait for room.
            let reset = sqlx::query(
                "UPDATE runs SET state = 'queued', started_at = NULL, lease_until = NULL WHERE id = $1",
            )
            .bind(run)
            .execute(&state.db)
            .await;
            if let Err(error) = state.run_queue.push(team, run, true).await {
                tracing::warn!(%run, error = %error, "queueing a run again failed (it will be found again)");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            reset
        }
        Err(error) => {
            tracing::warn!(%run, error = format!("{error:#}"), "a run failed");
            sqlx::query(
                "UPDATE runs SET state = 'failed', error = $2, finished_at = now(), lease_until = NULL WHERE id = $1",
            )
            .bind(run)
            .bind(public_error(&error))
            .execute(&state.db)
            .await
        }
    };
    if let Err(error) = result {
        tracing::error!(%run, error = %error, "recording a run's outcome failed");
    }
    if claimed.has_inputs {
        state
            .artifacts
            .delete(&state.artifacts.inputs(team, run))
            .await;
    }
}

/// What a failed run says about why: API errors keep their message, the rest is generic.
fn public_error(error: &anyhow::Error) -> String {
    match error.downcast_ref::<ApiError>() {
        Some(api) => format!("{} ({})", api, api.code()),
        None => "the run could not be carried out (internal error)".to_owned(),
    }
}

fn truncate(text: &str) -> String {
    if text.len() <= KEPT_OUTPUT {
        return text.to_owned();
    }
    let mut end = KEPT_OUTPUT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

enum Outcome {
    Done {
        exec: ExecResult,
        artifact_size: Option<u64>,
    },
    NoRoom,
}

async fn carry_out(
    state: &AppState,
    run: Uuid,
    claimed: &Claimed,
    placing: Starting,
) -> anyhow::Result<Outcome> {
    let owner = Owner {
        team_id: claimed.team_id,
        api_key_id: claimed.api_key_id,
        user_id: claimed.user_id,
    };
    let placement = Placement {
        template: claimed.template.clone(),
        env: claimed.env.0.clone(),
        cwd: "/work".to_owned(),
        // The command's time, and a margin for inputs and outputs.
        timeout_secs: claimed.timeout_secs as u64 + 120,
        resources: Resources {
            cpu_millis: claimed.cpu_millis as u32,
            memory_mb: claimed.memory_mb as u32,
            disk_mb: claimed.disk_mb as u32,
            pids: claimed.pids as u32,
        },
        metadata: [("run".to_owned(), run.to_string())].into(),
        max_credits: None,
        egress: claimed.egress.as_ref().map(|policy| policy.0.clone()),
        credentials: claimed.credentials.clone(),
        mounts: Vec::new(),
    };
    let created = sandboxes::create(state, owner, None, placement).await;
    // Placed (and counted in the workers' snapshot), or not placed at all.
    drop(placing);
    let created = match created {
        Ok(created) => created,
        Err(ApiError::Problem {
            code: "no_capacity" | "no_workers",
            ..
        }) => return Ok(Outcome::NoRoom),
        Err(error) => return Err(anyhow::Error::new(error)),
    };
    let sandbox = created.row.id;
    sqlx::query("UPDATE runs SET sandbox_id = $2 WHERE id = $1")
        .bind(run)
        .bind(sandbox)
        .execute(&state.db)
        .await?;
    let result = in_sandbox(state, run, claimed, sandbox, &created.worker_url).await;
    if let Err(error) = sandboxes::destroy_for_system(state, sandbox).await {
        tracing::warn!(%sandbox, error = format!("{error:#}"), "destroying a run's sandbox failed (the reaper will)");
    }
    result
}

async fn in_sandbox(
    state: &AppState,
    run: Uuid,
    claimed: &Claimed,
    sandbox: Uuid,
    worker_url: &str,
) -> anyhow::Result<Outcome> {
    let base = format!("{worker_url}/internal/v1/sandboxes/{sandbox}");
    if claimed.has_inputs {
        let inputs = state
            .artifacts
            .read(&state.artifacts.inputs(claimed.team_id, run))
            .await?
            .context("the run's inputs are missing from the store")?;
        let answer = state
            .workers
            .request(
                reqwest::Method::PUT,
                format!("{base}/archive?path=/work/in"),
            )
            .header("x-sandbase-owner", "root")
            .body(inputs)
            .send()
            .await?;
        if !answer.status().is_success() {
            return Err(anyhow::Error::new(sandboxes::worker_problem(answer).await)
                .context("unpacking the inputs"));
        }
        // Read-only to the command, whatever modes the archive carried.
        exec(
            state,
            &base,
            vec!["chmod".into(), "-R".into(), "a-w".into(), "/work/in".into()],
            RunAs::Root,
            None,
        )
        .await?;
    }
    exec(
        state,
        &base,
        vec!["mkdir".into(), "-p".into(), claimed.outputs.clone()],
        RunAs::User,
        None,
    )
    .await?;
    let result = exec(
        state,
        &base,
        claimed.argv.0.clone(),
        RunAs::User,
        Some(claimed.timeout_secs as u64 * 1000),
    )
    .await?;
    // The outputs directory, as the artifact.
    let answer = state
        .workers
        .request(
            reqwest::Method::GET,
            format!("{base}/archive?path={}", claimed.outputs),
        )
        .send()
        .await?;
    let artifact_size = if answer.status().is_success() {
        // Stored as it arrives; the object appears only once complete.
        let mut writer = state
            .artifacts
            .writer(state.artifacts.artifact(claimed.team_id, run));
        let mut size = 0u64;
        let mut body = answer.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(error) => {
                    let _ = writer.abort().await;
                    return Err(anyhow::Error::new(error).context("reading the artifact"));
                }
            };
            size += chunk.len() as u64;
            writer.write_all(&chunk).await?;
        }
        writer.shutdown().await.context("storing the artifact")?;
        Some(size)
    } else {
        // The command removed its outputs directory: no artifact.
        None
    };
    Ok(Outcome::Done {
        exec: result,
        artifact_size,
    })
}

async fn exec(
    state: &AppState,
    base: &str,
    argv: Vec<String>,
    user: RunAs,
    timeout_ms: Option<u64>,
) -> anyhow::Result<ExecResult> {
    let answer = state
        .workers
        .request(reqwest::Method::POST, format!("{base}/exec"))
        .json(&Exec {
            argv,
            env: BTreeMap::new(),
            cwd: None,
            user,
            stdin: None,
            timeout_ms,
            stream: false,
            background: false,
        })
        .send()
        .await?;
    if !answer.status().is_success() {
        return Err(anyhow::Error::new(sandboxes::worker_problem(answer).await));
    }
    Ok(answer.json().await?)
}

/// Runs whose gateway stopped renewing their lease failed.
pub async fn reap(state: &AppState) -> anyhow::Result<()> {
    let abandoned: Vec<(Uuid, Option<Uuid>)> = sqlx::query_as(
        "UPDATE runs SET state = 'failed', error = 'the gateway carrying out this run stopped', \
         finished_at = now(), lease_until = NULL \
         WHERE state = 'running' AND lease_until < now() RETURNING id, sandbox_id",
    )
    .fetch_all(&state.db)
    .await?;
    for sandbox in abandoned.into_iter().filter_map(|(_, sandbox)| sandbox) {
        sandboxes::destroy_for_system(state, sandbox).await?;
    }
    Ok(())
}
