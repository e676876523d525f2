//! Creating a sandbox: its first minute reserved against the team's credits (and the key's
//! cap), a row first (so nothing can exist on a worker without one), then the best worker
//! that has room; a worker that is full passes it to the next.

use sandbase_api::internal::{CreateSandbox, WorkerStatus};
use uuid::Uuid;

use super::lifecycle::{self, NewRow};
use super::route_cache::Route;
use super::row::{Created, Owner};
use super::snapshots::SnapshotRow;
use super::validate::NewSandbox;
use crate::audit::Requester;
use crate::credits::Admitted;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub async fn create(
    state: &AppState,
    owner: Owner,
    requester: Requester<'_>,
    sandbox: NewSandbox,
) -> ApiResult<Created> {
    // A secret the caller's role may not attach, no worker or no template: refused before
    // anything is reserved.
    if let Some(principal) = requester.principal() {
        crate::secrets::ensure_usable(state, principal, &sandbox.credentials).await?;
    }
    state
        .sandboxes
        .workers
        .candidates(&placement_of(&sandbox, owner))
        .await?;
    let id = Uuid::now_v7();
    // The first minute is reserved before anything starts, against the team's credits and
    // the key's cap; refused when either is spent. A sandbox with a cap of its own is charged
    // at every sample and never past its caps: one charging interval ahead is reserved (at
    // most its cap), so the rest of its key's budget stays for the key's other calls.
    let billing = &state.settings.billing;
    let per_second = crate::credits::price_per_second(sandbox.resources, billing);
    let first_minute = match sandbox.max_credits {
        Some(cap) => (per_second * billing.charge_every_secs as i64).min(cap),
        None => per_second * 60,
    };
    // What the key spends counts against its ancestors' caps too.
    let keys =
        crate::credits::Cap::keys(&crate::keys::with_ancestors(&state.db, owner.api_key_id).await?);
    if first_minute > 0 {
        reserve(state, owner.team_id, &keys, id, first_minute, 60_000).await?;
    }
    let created = place(state, owner, requester, sandbox, id).await;
    if created.is_err() && first_minute > 0 {
        let _ = state
            .billing
            .admission
            .release(owner.team_id, &keys, id, first_minute)
            .await;
    }
    created
}

/// What `sandbox` needs of its worker.
pub fn placement_of(sandbox: &NewSandbox, owner: Owner) -> crate::workers::registry::Placement<'_> {
    crate::workers::registry::Placement {
        template: sandbox.template.as_str(),
        mounts: &sandbox.mounts,
        isolation: sandbox.isolation,
        team_id: owner.team_id,
    }
}

/// Reserves `amount` for `ttl_ms` against the team's credits and the caps of `keys` (a key
/// and its ancestors): 402 `insufficient_credits` or `spend_cap_reached` when one refuses,
/// 503 when Redis cannot answer (spend control fails closed).
pub async fn reserve(
    state: &AppState,
    team_id: Uuid,
    keys: &[crate::credits::Cap],
    id: Uuid,
    amount: i64,
    ttl_ms: u64,
) -> ApiResult<()> {
    let admitted = state
        .billing
        .admission
        .reserve(&state.db, team_id, keys, id, amount, ttl_ms)
        .await
        .map_err(|error| ApiError::Unavailable(format!("credit admission: {error:#}")))?;
    match admitted {
        Admitted::Yes => Ok(()),
        Admitted::InsufficientCredits => Err(ApiError::InsufficientCredits),
        Admitted::KeyCapReached | Admitted::SandboxCapReached => Err(ApiError::SpendCapReached),
    }
}

async fn place(
    state: &AppState,
    owner: Owner,
    requester: Requester<'_>,
    sandbox: NewSandbox,
    id: Uuid,
) -> ApiResult<Created> {
    let mut candidates = state
        .sandboxes
        .workers
        .candidates(&placement_of(&sandbox, owner))
        .await?;
    // Credentials (and store credentials) travel to a worker only over TLS.
    if !sandbox.credentials.is_empty() || sandbox.store {
        candidates.retain(|worker| worker.url.starts_with("https://"));
        if candidates.is_empty() {
            return Err(ApiError::NoSecureWorker);
        }
    }
    // Decrypted only for the worker's request (unknown names refused before anything is
    // written), and wiped once it has been sent.
    let credentials =
        crate::secrets::unseal_for_sandbox(state, owner.team_id, &sandbox.credentials).await?;
    // The row is written only while the team is under its quota (counted and written under
    // the team's lock, so concurrent creates cannot all slip under it).
    let store_token = sandbox
        .store
        .then(crate::auth::store_token::StoreToken::generate);
    let mut transaction = state.db.begin().await?;
    let quota = lifecycle::lock_team_quota(
        &mut transaction,
        owner.team_id,
        state.settings.sandboxes.max_per_team,
    )
    .await?;
    if quota.held >= quota.max {
        return Err(ApiError::SandboxQuotaReached(quota.max));
    }
    lifecycle::insert_creating(
        &mut transaction,
        NewRow {
            id,
            owner,
            sandbox: &sandbox,
            store_token_hash: store_token.as_ref().map(|token| token.hash()),
        },
    )
    .await?;
    transaction.commit().await?;
    let mut request = CreateSandbox {
        id,
        team_id: Some(owner.team_id),
        isolation: sandbox.isolation,
        template: sandbox.template.into_string(),
        resources: sandbox.resources,
        env: sandbox.env,
        cwd: sandbox.cwd,
        mounts: sandbox.mounts,
        egress: sandbox.egress,
        credentials,
        auto_pause_after_idle_secs: sandbox.auto_pause_after_idle_secs,
        store_token: store_token
            .as_ref()
            .map(|token| sandbase_api::internal::StoreToken(token.0.clone())),
    };
    let placed = send_create(
        state,
        &request,
        candidates,
        owner,
        requester,
        sandbox.snapshot.as_ref(),
    )
    .await;
    for credential in &mut request.credentials {
        zeroize::Zeroize::zeroize(&mut credential.value);
    }
    if let Some(token) = &mut request.store_token {
        zeroize::Zeroize::zeroize(&mut token.0);
    }
    placed
}

async fn send_create(
    state: &AppState,
    request: &CreateSandbox,
    candidates: Vec<WorkerStatus>,
    owner: Owner,
    requester: Requester<'_>,
    snapshot: Option<&SnapshotRow>,
) -> ApiResult<Created> {
    let id = request.id;
    let mut last_problem = None;
    for worker in candidates {
        let address = crate::workers::registry::address(&worker);
        let mut connection = state.db.acquire().await?;
        lifecycle::assign_worker(&mut connection, id, &worker.id).await?;
        drop(connection);
        state.sandboxes.workers.placed(&worker.id);
        match state
            .sandboxes
            .worker_client
            .create_sandbox(&address, request)
            .await
        {
            Ok(()) => {
                // The snapshot's state is in place before anyone can use the sandbox.
                if let Some(snapshot) = snapshot
                    && let Err(error) =
                        super::snapshots::restore(state, &address, id, snapshot).await
                {
                    super::teardown::remove_on_worker(state, &worker.id, id).await;
                    let mut connection = state.db.acquire().await?;
                    lifecycle::mark_failed(&mut connection, id).await?;
                    return Err(error);
                }
                let mut transaction = state.db.begin().await?;
                let row = lifecycle::mark_running(&mut transaction, id).await?;
                requester
                    .record(
                        &mut transaction,
                        Some(format!("sandbox:{id}")),
                        serde_json::json!({
                            "template": row.template,
                            "worker": worker.id,
                            "resources": request.resources,
                        }),
                    )
                    .await?;
                transaction.commit().await?;
                state.sandboxes.routes.insert(
                    id,
                    Route {
                        team_id: owner.team_id,
                        worker_id: worker.id,
                    },
                );
                return Ok(Created {
                    row,
                    worker: address,
                });
            }
            Err(error) if error.is_at_capacity() => last_problem = Some(error),
            Err(error) => {
                last_problem = Some(error);
                break;
            }
        }
    }
    // Nothing runs: the row is marked failed.
    let mut connection = state.db.acquire().await?;
    lifecycle::mark_failed(&mut connection, id).await?;
    Err(match last_problem {
        Some(error) if !error.is_at_capacity() => ApiError::Worker(error),
        _ => ApiError::NoCapacity,
    })
}
