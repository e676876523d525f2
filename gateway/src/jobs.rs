//! Every periodic job of a gateway, each with its own interval and tracing span. Every
//! gateway runs them all: the statements they make take their rows with `SKIP LOCKED` or an
//! advisory lock, so gateways share the work rather than repeat it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use chrono::Utc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::sandboxes::lifecycle::{self, SystemStop};
use crate::sandboxes::teardown;
use crate::state::AppState;

/// A CREATE still `creating` after this long failed (its gateway died mid-create).
const CREATE_GIVE_UP_SECS: f64 = 120.0;
/// How often batched `last_used_at` updates of API keys are written.
const LAST_USED_FLUSH_INTERVAL: Duration = Duration::from_secs(2);

type JobFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// One periodic job: its name (the span and the log lines), how often, and what it does.
struct Job {
    name: &'static str,
    every: Duration,
    run: fn(AppState) -> JobFuture,
}

const SECOND: Duration = Duration::from_secs(1);

const JOBS: &[Job] = &[
    Job {
        name: "expire_sandboxes",
        every: SECOND,
        run: |state| Box::pin(expire_sandboxes(state)),
    },
    Job {
        name: "lost_workers",
        every: SECOND,
        run: |state| Box::pin(lost_workers(state)),
    },
    Job {
        name: "abandoned_creates",
        every: SECOND,
        run: |state| Box::pin(abandoned_creates(state)),
    },
    Job {
        name: "run_leases",
        every: SECOND,
        run: |state| Box::pin(run_leases(state)),
    },
    Job {
        name: "charging",
        every: SECOND,
        run: |state| Box::pin(charging(state)),
    },
    Job {
        name: "spend_caps",
        every: SECOND,
        run: |state| Box::pin(spend_caps(state)),
    },
    Job {
        name: "key_ended",
        every: SECOND,
        run: |state| Box::pin(key_ended(state)),
    },
    Job {
        name: "zero_credits",
        every: SECOND,
        run: |state| Box::pin(zero_credits(state)),
    },
    Job {
        name: "grant_expiry",
        every: SECOND,
        run: |state| Box::pin(grant_expiry(state)),
    },
    Job {
        name: "failed_auth",
        every: SECOND,
        run: |state| Box::pin(failed_auth(state)),
    },
    Job {
        name: "artifact_retention",
        every: Duration::from_secs(5),
        run: |state| Box::pin(artifact_retention(state)),
    },
    Job {
        name: "store_credentials",
        every: SECOND,
        run: |state| Box::pin(store_credentials(state)),
    },
    Job {
        name: "key_last_used",
        every: LAST_USED_FLUSH_INTERVAL,
        run: |state| Box::pin(key_last_used(state)),
    },
];

/// Starts every job on its own task.
pub fn spawn_all(state: &AppState) -> Vec<JoinHandle<()>> {
    JOBS.iter()
        .map(|job| {
            let state = state.clone();
            tokio::spawn(
                async move {
                    let mut interval = tokio::time::interval(job.every);
                    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        interval.tick().await;
                        if let Err(error) = (job.run)(state.clone()).await {
                            tracing::warn!(
                                job = job.name,
                                error = format!("{error:#}"),
                                "a periodic job failed"
                            );
                        }
                    }
                }
                .instrument(tracing::info_span!("job", name = job.name)),
            )
        })
        .collect()
}

/// Stops what `stop` selects and removes it from its workers in the background.
async fn stop_and_remove(state: &AppState, stop: SystemStop<'_>) -> anyhow::Result<()> {
    let mut transaction = state.db.begin().await?;
    let stopped = lifecycle::stop_system(&mut transaction, stop).await?;
    transaction.commit().await?;
    if !stopped.is_empty() {
        let state = state.clone();
        tokio::spawn(async move { teardown::remove_stopped(&state, stopped).await });
    }
    Ok(())
}

/// Run artifacts and snapshots: the ones past their retention deleted, the kept ones
/// metered.
async fn artifact_retention(state: AppState) -> anyhow::Result<()> {
    let expired = crate::runs::retention::expire(&state).await?;
    if expired > 0 {
        tracing::info!(expired, "run artifacts past their retention deleted");
    }
    let expired = crate::sandboxes::snapshots::expire(&state).await?;
    if expired > 0 {
        tracing::info!(expired, "snapshots past their retention deleted");
    }
    let expired = crate::sandboxes::recordings::expire(&state).await?;
    if expired > 0 {
        tracing::info!(expired, "terminal recordings past their retention deleted");
    }
    crate::runs::retention::meter(&state).await?;
    Ok(())
}

/// Sandboxes whose lifetime ended.
async fn expire_sandboxes(state: AppState) -> anyhow::Result<()> {
    stop_and_remove(&state, SystemStop::Expired).await
}

/// Sandboxes of workers silent for longer than `workers.lost_after_secs`.
async fn lost_workers(state: AppState) -> anyhow::Result<()> {
    let lost_after_secs = state.settings.workers.lost_after_secs as f64;
    stop_and_remove(&state, SystemStop::WorkerSilent { lost_after_secs }).await
}

/// Creates abandoned by a gateway that died.
async fn abandoned_creates(state: AppState) -> anyhow::Result<()> {
    stop_and_remove(
        &state,
        SystemStop::Abandoned {
            after_secs: CREATE_GIVE_UP_SECS,
        },
    )
    .await
}

/// Runs whose gateway stopped renewing their lease.
async fn run_leases(state: AppState) -> anyhow::Result<()> {
    crate::runs::dispatch::reap(&state).await
}

/// Usage written by the workers, charged on the ledger.
async fn charging(state: AppState) -> anyhow::Result<()> {
    crate::usage::charge::charge_all(&state).await
}

/// Running sandboxes that reached their own spend cap, or whose API key reached its cap,
/// stop at once (the cap is the team's own limit: no grace period).
async fn spend_caps(state: AppState) -> anyhow::Result<()> {
    stop_and_remove(&state, SystemStop::SpendCap).await
}

/// Sandboxes made with an API key since revoked or expired stop (unless the operator keeps
/// them: `sandboxes.stop_with_key = false`); their previews go with them.
async fn key_ended(state: AppState) -> anyhow::Result<()> {
    if !state.settings.sandboxes.stop_with_key {
        return Ok(());
    }
    stop_and_remove(&state, SystemStop::KeyEnded).await
}

/// Teams at zero (or below) with running sandboxes: after `billing.grace_secs`, their
/// sandboxes stop, with the reason on each sandbox and in the audit log.
async fn zero_credits(state: AppState) -> anyhow::Result<()> {
    let teams = lifecycle::teams_running(&state.db).await?;
    let mut redis = state.redis.clone();
    for team_id in teams {
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
            state.billing.admission.forget(team_id).await?;
        }
        let since: i64 = redis::AsyncCommands::get(&mut redis, &key).await?;
        if now - since < state.settings.billing.grace_secs as i64 * 1000 {
            continue;
        }
        stop_and_remove(&state, SystemStop::CreditsExhausted(team_id)).await?;
    }
    Ok(())
}

/// Grants past their expiry: what is left goes to breakage.
async fn grant_expiry(state: AppState) -> anyhow::Result<()> {
    let mut connection = state.db.acquire().await?;
    sandbase_billing::expire_grants(&mut connection).await?;
    Ok(())
}

/// The counted failed authentications of windows that ended.
async fn failed_auth(state: AppState) -> anyhow::Result<()> {
    crate::failed_auth::flush(&state.auth.failed_auth, &state.db).await?;
    Ok(())
}

/// API keys' batched `last_used_at`.
/// The store's credentials from files and operator secrets, read again when
/// `store.credentials_refresh_secs` has passed.
async fn store_credentials(state: AppState) -> anyhow::Result<()> {
    state
        .store
        .refresh_credentials(&state.db, state.vault.as_deref())
        .await;
    Ok(())
}

async fn key_last_used(state: AppState) -> anyhow::Result<()> {
    state.auth.last_used.flush(&state.db).await?;
    Ok(())
}
