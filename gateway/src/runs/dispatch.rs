//! The dispatcher every gateway runs: it takes the next run off the queue only while some
//! worker has room, claims it in PostgreSQL (a lease it renews), and carries it out: a
//! sandbox, the inputs unpacked into `/work/in` (owned by the sandbox's root, read-only to
//! the command), the command as the sandbox user, the outputs directory archived into the
//! artifact store, the sandbox destroyed. A run whose worker turns out full goes back to
//! the front of its team's queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use sandbase_api::internal::Exec;
use sandbase_api::sandboxes::{ExecResult, Isolation, Resources, RunAs, TemplateName};
use tokio::sync::Semaphore;
use uuid::Uuid;

use super::lifecycle::{self, Claimed};
use crate::error::ApiError;
use crate::sandboxes::{NewSandbox, Owner, placement, teardown};
use crate::state::AppState;
use crate::workers::WorkerAddress;
use crate::workers::client::ArchiveOwner;

/// Output of the command kept on the run (each stream).
const KEPT_OUTPUT: usize = 64 * 1024;
/// How often queued runs missing from Redis are looked for.
const REQUEUE_EVERY: Duration = Duration::from_secs(10);

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
        let woken = state.sandboxes.run_queue.wake.notified();
        if !has_room(&state, starting.load(Ordering::Acquire)).await {
            let _ = tokio::time::timeout(Duration::from_millis(200), woken).await;
            continue;
        }
        let Ok(permit) = Arc::clone(&concurrency).acquire_owned().await else {
            return;
        };
        match state.sandboxes.run_queue.pop().await {
            Ok(Some((team, run))) => {
                let state = state.clone();
                starting.fetch_add(1, Ordering::AcqRel);
                let placing = Starting(Arc::clone(&starting));
                tokio::spawn(async move {
                    execute(&state, team, run, placing).await;
                    drop(permit);
                    state.sandboxes.run_queue.wake.notify_waiters();
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
    match state.sandboxes.workers.live().await {
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
    let mut connection = state.db.acquire().await?;
    let queued = lifecycle::queued_a_while(&mut connection).await?;
    drop(connection);
    for (run, team) in queued {
        if !state.sandboxes.run_queue.contains(run).await? {
            tracing::info!(%run, "a queued run was missing from Redis; queued again");
            state.sandboxes.run_queue.push(team, run).await?;
        }
    }
    Ok(())
}

/// Carries out one run taken off the queue.
async fn execute(state: &AppState, team: Uuid, run: Uuid, placing: Starting) {
    let claimed = match claim(state, run).await {
        Ok(claimed) => claimed,
        Err(error) => {
            tracing::warn!(%run, error = %error, "claiming a run failed; queued again");
            let _ = state.sandboxes.run_queue.push_front(team, run).await;
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
                tokio::time::sleep(Duration::from_secs_f64(lifecycle::LEASE_SECS / 3.0)).await;
                if let Ok(mut connection) = state.db.acquire().await {
                    let _ = lifecycle::renew_lease(&mut connection, run).await;
                }
            }
        })
    };
    let outcome = carry_out(state, run, &claimed, placing).await;
    renewal.abort();
    if let Err(error) = record_outcome(state, team, run, outcome).await {
        tracing::error!(%run, error = %error, "recording a run's outcome failed");
    }
    if claimed.has_inputs {
        state
            .sandboxes
            .artifacts
            .delete(&state.sandboxes.artifacts.inputs(team, run))
            .await;
    }
}

async fn claim(state: &AppState, run: Uuid) -> Result<Option<Claimed>, sqlx::Error> {
    let mut connection = state.db.acquire().await?;
    lifecycle::claim(&mut connection, run).await
}

/// Writes how the run ended (or puts it back in the queue when no worker had room).
async fn record_outcome(
    state: &AppState,
    team: Uuid,
    run: Uuid,
    outcome: anyhow::Result<Outcome>,
) -> Result<(), sqlx::Error> {
    let mut connection = state.db.acquire().await?;
    match outcome {
        Ok(Outcome::Done {
            exec,
            artifact_size,
        }) => {
            let (stdout, stderr) = (truncate(&exec.stdout), truncate(&exec.stderr));
            lifecycle::complete(&mut connection, run, &exec, &stdout, &stderr, artifact_size).await
        }
        Ok(Outcome::NoRoom) => {
            // Back to the front of its team's queue, to wait for room.
            let reset = lifecycle::requeue(&mut connection, run).await;
            drop(connection);
            if let Err(error) = state.sandboxes.run_queue.push_front(team, run).await {
                tracing::warn!(%run, error = %error, "queueing a run again failed (it will be found again)");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            reset
        }
        Err(error) => {
            tracing::warn!(%run, error = format!("{error:#}"), "a run failed");
            lifecycle::fail(&mut connection, run, &public_error(&error)).await
        }
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
    let template = TemplateName::parse(&claimed.template).map_err(anyhow::Error::msg)?;
    let sandbox = NewSandbox {
        template,
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
        isolation: Isolation::parse(&claimed.isolation).unwrap_or_default(),
        auto_pause_after_idle_secs: None,
        snapshot: None,
        // Its variables are in `env` already.
        store: claimed.store,
    };
    let created = placement::create(state, owner, crate::audit::Requester::Run, sandbox).await;
    // Placed (and counted in the workers' snapshot), or not placed at all.
    drop(placing);
    let created = match created {
        Ok(created) => created,
        // No room on the workers, or in the team's quota: the run waits its turn again.
        Err(ApiError::NoCapacity | ApiError::NoWorkers | ApiError::SandboxQuotaReached(_)) => {
            return Ok(Outcome::NoRoom);
        }
        Err(error) => return Err(anyhow::Error::new(error)),
    };
    let sandbox = created.row.id;
    let mut connection = state.db.acquire().await?;
    lifecycle::set_sandbox(&mut connection, run, sandbox).await?;
    drop(connection);
    let result = in_sandbox(state, run, claimed, sandbox, &created.worker).await;
    if let Err(error) = teardown::destroy_for_system(state, sandbox).await {
        tracing::warn!(%sandbox, error = format!("{error:#}"), "destroying a run's sandbox failed (the reaper will)");
    }
    result
}

async fn in_sandbox(
    state: &AppState,
    run: Uuid,
    claimed: &Claimed,
    sandbox: Uuid,
    worker: &WorkerAddress,
) -> anyhow::Result<Outcome> {
    let workers = &state.sandboxes.worker_client;
    if claimed.has_inputs {
        let inputs = state
            .sandboxes
            .artifacts
            .read(&state.sandboxes.artifacts.inputs(claimed.team_id, run))
            .await?
            .context("the run's inputs are missing from the store")?;
        workers
            .put_archive(worker, sandbox, "/work/in", ArchiveOwner::Root, inputs)
            .await
            .context("unpacking the inputs")?;
        // Read-only to the command, whatever modes the archive carried.
        let chmod = ["chmod", "-R", "a-w", "/work/in"]
            .map(str::to_owned)
            .to_vec();
        workers
            .exec(worker, sandbox, &command(chmod, RunAs::Root, None))
            .await?;
    }
    let mkdir = vec!["mkdir".to_owned(), "-p".to_owned(), claimed.outputs.clone()];
    workers
        .exec(worker, sandbox, &command(mkdir, RunAs::User, None))
        .await?;
    let timeout_ms = Some(claimed.timeout_secs as u64 * 1000);
    let result = workers
        .exec(
            worker,
            sandbox,
            &command(claimed.argv.0.clone(), RunAs::User, timeout_ms),
        )
        .await?;
    // The outputs directory, as the artifact; none when the command removed it.
    let artifact_size = match workers
        .get_archive(worker, sandbox, &claimed.outputs)
        .await?
    {
        Some(answer) => Some(
            state
                .sandboxes
                .artifacts
                .put_stream(
                    state.sandboxes.artifacts.artifact(claimed.team_id, run),
                    answer,
                )
                .await?,
        ),
        None => None,
    };
    Ok(Outcome::Done {
        exec: result,
        artifact_size,
    })
}

fn command(argv: Vec<String>, user: RunAs, timeout_ms: Option<u64>) -> Exec {
    Exec {
        timeout_ms,
        ..Exec::new(argv, user)
    }
}

/// Runs whose gateway stopped renewing their lease failed.
pub async fn reap(state: &AppState) -> anyhow::Result<()> {
    let mut connection = state.db.acquire().await?;
    let sandboxes = lifecycle::fail_abandoned(&mut connection).await?;
    drop(connection);
    for sandbox in sandboxes {
        teardown::destroy_for_system(state, sandbox).await?;
    }
    Ok(())
}
