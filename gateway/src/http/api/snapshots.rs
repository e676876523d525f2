//! Snapshots of a team's sandboxes: taken from a live sandbox, listed, deleted; a sandbox
//! starts from one with `POST /v1/sandboxes {"snapshot": ID}`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandbase_api::snapshots::{Snapshot, SnapshotList};
use sandbase_api::{ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::{RequestContext, Requester};
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::http::extract::ApiPath;
use crate::sandboxes::{Owner, snapshots};
use crate::state::AppState;

const MAX_LIST: i64 = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(take_snapshot))
        .routes(routes!(list_snapshots))
        .routes(routes!(get_snapshot, delete_snapshot))
}

/// Snapshot a sandbox's `/work` and `/tmp` (files, directories and links with their modes,
/// owners and times). Taken while the sandbox runs: pause nothing, but files written during
/// the snapshot may be caught half-way. Kept for `sandboxes.snapshot_retention_secs`,
/// metered as storage meanwhile.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshots", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses(
        (status = 201, description = "Taken", body = Snapshot),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "Not running (`sandbox_not_running`) or paused (`sandbox_paused`)", body = ErrorBody),
    ))]
async fn take_snapshot(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<(StatusCode, Json<Snapshot>)> {
    let audit = context.action("sandbox.snapshot");
    principal.require(Role::Member)?;
    let requester = Requester::member(&audit, &principal);
    let snapshot = snapshots::take(&state, Owner::of(&principal), requester, id).await?;
    Ok((StatusCode::CREATED, Json(snapshot.to_api())))
}

/// The team's snapshots, newest first.
#[utoipa::path(get, path = "/v1/snapshots", tag = "sandboxes", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = SnapshotList)))]
async fn list_snapshots(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<SnapshotList>> {
    let rows = snapshots::list(&state, principal.team_id, MAX_LIST).await?;
    Ok(Json(SnapshotList {
        snapshots: rows.iter().map(snapshots::SnapshotRow::to_api).collect(),
    }))
}

/// One snapshot of the team.
#[utoipa::path(get, path = "/v1/snapshots/{id}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Snapshot id")),
    responses((status = 200, description = "OK", body = Snapshot), (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn get_snapshot(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<Snapshot>> {
    Ok(Json(
        snapshots::find(&state, principal.team_id, id)
            .await?
            .to_api(),
    ))
}

/// Delete a snapshot and its archives.
#[utoipa::path(delete, path = "/v1/snapshots/{id}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Snapshot id")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn delete_snapshot(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    let audit = context.action("snapshot.delete");
    principal.require(Role::Member)?;
    let requester = Requester::member(&audit, &principal);
    snapshots::delete(&state, principal.team_id, requester, id).await?;
    Ok(StatusCode::NO_CONTENT)
}
