//! Data-plane calls: the worker of a live (running or paused) sandbox of the caller's team (from the route
//! cache, else PostgreSQL), and the call passed to it. A worker that no longer has the
//! sandbox makes the gateway look again at what happened to it.

use uuid::Uuid;

use super::lifecycle::{self, SandboxState, StopReason};
use super::route_cache::Route;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::workers::WorkerAddress;
use crate::workers::client::{SandboxCall, WorkerAnswer};

/// The id and internal URL of the worker hosting a live sandbox of `team_id` (a paused
/// one's worker refuses or resumes the call: it alone knows whether it paused by itself).
pub async fn route(state: &AppState, team_id: Uuid, id: Uuid) -> ApiResult<WorkerAddress> {
    let worker_id = match state.sandboxes.routes.get(id) {
        Some(route) if route.team_id == team_id => route.worker_id,
        Some(_) => return Err(ApiError::NotFound("sandbox")),
        None => match lifecycle::whereabouts(&state.db, team_id, id).await? {
            None => return Err(ApiError::NotFound("sandbox")),
            Some(lifecycle::Whereabouts {
                state: SandboxState::Running | SandboxState::Paused,
                worker_id: Some(worker_id),
                ..
            }) => {
                state.sandboxes.routes.insert(
                    id,
                    Route {
                        team_id,
                        worker_id: worker_id.clone(),
                    },
                );
                worker_id
            }
            Some(found) => return Err(not_running(found.state, found.stop_reason)),
        },
    };
    state.sandboxes.workers.address_of(&worker_id).await
}

/// 409 `sandbox_not_running`, saying what the sandbox is and why.
pub fn not_running(state: SandboxState, reason: Option<StopReason>) -> ApiError {
    ApiError::SandboxNotRunning(match reason {
        Some(reason) => format!("the sandbox is {state} ({reason})"),
        None => format!("the sandbox is {state}"),
    })
}

/// Passes `call` to the worker of a running sandbox of `team_id`; the answer is streamed
/// back by the caller.
pub async fn forward(
    state: &AppState,
    team_id: Uuid,
    id: Uuid,
    call: SandboxCall,
) -> ApiResult<WorkerAnswer> {
    let worker = route(state, team_id, id).await?;
    match state
        .sandboxes
        .worker_client
        .sandbox_call(&worker, id, call)
        .await
    {
        Ok(answer) => Ok(answer),
        Err(error) if error.is_sandbox_not_found() => {
            state.sandboxes.routes.forget(id);
            match lifecycle::whereabouts(&state.db, team_id, id).await? {
                Some(found)
                    if !matches!(found.state, SandboxState::Running | SandboxState::Paused) =>
                {
                    Err(not_running(found.state, found.stop_reason))
                }
                _ => Err(ApiError::NotFound("sandbox")),
            }
        }
        Err(error) => Err(error.into()),
    }
}
