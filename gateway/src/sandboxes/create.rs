//! A sandbox as any caller asks for it: the team's default egress policy when the request
//! names none, a snapshot's template, then the request checked and placed. Every caller
//! (the API, MCP, the harness) comes through here, so the rules hold for all of them.

use sandbase_api::sandboxes::{CreateSandboxRequest, EgressPolicy};
use uuid::Uuid;

use super::placement;
use super::row::{Created, Owner};
use super::snapshots::{self, SnapshotRow};
use super::validate::NewSandbox;
use crate::audit::Requester;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Creates a sandbox of `owner`'s team from `request`; its row commits with `requester`'s
/// audit row once it runs.
pub async fn create(
    state: &AppState,
    owner: Owner,
    requester: Requester<'_>,
    mut request: CreateSandboxRequest,
) -> ApiResult<Created> {
    with_team_default(state, owner.team_id, &mut request.egress).await?;
    let snapshot = snapshot_of(state, owner.team_id, &mut request).await?;
    let mut sandbox = NewSandbox::parse(request, &state.settings.sandboxes)?;
    sandbox.snapshot = snapshot;
    placement::create(state, owner, requester, sandbox).await
}

/// The team's default egress policy, when `egress` names none (sandboxes and runs alike).
pub async fn with_team_default(
    state: &AppState,
    team_id: Uuid,
    egress: &mut Option<EgressPolicy>,
) -> ApiResult<()> {
    if egress.is_none() {
        *egress = crate::teams::default_egress(&state.db, team_id).await?;
    }
    Ok(())
}

/// The snapshot a request starts from, if any: the team's (404 otherwise), and the sandbox
/// is of the snapshot's template (another template named is refused).
async fn snapshot_of(
    state: &AppState,
    team_id: Uuid,
    request: &mut CreateSandboxRequest,
) -> ApiResult<Option<SnapshotRow>> {
    let Some(id) = request.snapshot else {
        return Ok(None);
    };
    let snapshot = snapshots::find(state, team_id, id).await?;
    match &request.template {
        Some(template) if *template != snapshot.template => {
            return Err(ApiError::InvalidRequest(format!(
                "`template`: the snapshot is of template `{}`",
                snapshot.template
            )));
        }
        _ => request.template = Some(snapshot.template.clone()),
    }
    Ok(Some(snapshot))
}
