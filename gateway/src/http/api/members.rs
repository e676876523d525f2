//! Team members and roles. Membership changes lock the team row, so two concurrent
//! changes cannot together remove the last owner.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandbase_api::{
    AddMemberRequest, ErrorBody, Invitation, InvitationList, Member, MemberList, Role,
    UpdateMemberRequest,
};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::accounts::{MEMBER_SELECT, MemberRow};
use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::auth::key_cache::Invalidation;
use crate::error::ApiResult;
use crate::http::extract::{ApiJson, ApiPath};
use crate::invitations;
use crate::state::AppState;
use crate::teams::{self, find_member};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_members, add_member))
        .routes(routes!(get_member, update_member, remove_member))
        .routes(routes!(team_invitations))
        .routes(routes!(my_invitations))
        .routes(routes!(accept_invitation))
}

/// Members of the caller's team.
#[utoipa::path(get, path = "/v1/team/members", tag = "team", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = MemberList), (status = 401, description = "Missing or invalid credentials", body = ErrorBody)))]
async fn list_members(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<MemberList>> {
    let rows: Vec<MemberRow> = sqlx::query_as(&format!(
        "{MEMBER_SELECT} WHERE m.team_id = $1 ORDER BY m.created_at, m.user_id"
    ))
    .bind(principal.team_id)
    .fetch_all(&state.db)
    .await?;
    Ok(Json(MemberList {
        items: rows.iter().map(MemberRow::to_api).collect(),
    }))
}

/// One member of the caller's team.
#[utoipa::path(get, path = "/v1/team/members/{user_id}", tag = "team", security(("bearer" = [])),
    params(("user_id" = Uuid, Path)),
    responses((status = 200, description = "OK", body = Member), (status = 404, description = "Not found in the caller's team (`not_found`)", body = ErrorBody)))]
async fn get_member(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(user_id): ApiPath<Uuid>,
) -> ApiResult<Json<Member>> {
    let mut connection = state.db.acquire().await?;
    let member = find_member(&mut connection, principal.team_id, user_id).await?;
    Ok(Json(member.to_api()))
}

/// Invite a person (by e-mail) to the team: they join when they accept, logged in as the
/// owner of that address. The answer is the same whether the address has an account.
/// Admins invite members and admins; owners also owners. Inviting again renews.
#[utoipa::path(post, path = "/v1/team/members", tag = "team", security(("bearer" = [])),
    request_body = AddMemberRequest,
    responses(
        (status = 201, description = "Invitation made (or renewed)", body = Invitation),
        (status = 403, description = "Role does not allow this (`forbidden`), or a key with a cap, an expiry or a parent key (`restricted_key`)", body = ErrorBody),
        (status = 409, description = "Already a member (`already_member`)", body = ErrorBody),
    ))]
async fn add_member(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(request): ApiJson<AddMemberRequest>,
) -> ApiResult<(StatusCode, Json<Invitation>)> {
    principal.require_unrestricted("inviting a member")?;
    let audit = context.action("member.invite");
    let mut transaction = state.db.begin().await?;
    let invitation =
        invitations::invite(&mut transaction, &principal, &request.email, request.role).await?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("invitation:{}", invitation.id)),
            serde_json::json!({ "email": invitation.email, "role": request.role }),
        )
        .await?;
    transaction.commit().await?;
    Ok((StatusCode::CREATED, Json(invitation.to_api())))
}

/// The team's pending invitations.
#[utoipa::path(get, path = "/v1/team/invitations", tag = "team", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = InvitationList)))]
async fn team_invitations(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<InvitationList>> {
    principal.require(Role::Admin)?;
    let mut connection = state.db.acquire().await?;
    let rows = invitations::of_team(&mut connection, principal.team_id).await?;
    Ok(Json(InvitationList {
        items: rows
            .iter()
            .map(invitations::InvitationRow::to_api)
            .collect(),
    }))
}

/// The pending invitations addressed to the logged-in person (a dashboard session).
#[utoipa::path(get, path = "/v1/invitations", tag = "team", security(("bearer" = [])),
    responses(
        (status = 200, description = "OK", body = InvitationList),
        (status = 403, description = "Not a person's session (`forbidden`)", body = ErrorBody),
    ))]
async fn my_invitations(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<InvitationList>> {
    let mut connection = state.db.acquire().await?;
    let rows = invitations::for_person(&mut connection, &principal).await?;
    Ok(Json(InvitationList {
        items: rows
            .iter()
            .map(invitations::InvitationRow::to_api)
            .collect(),
    }))
}

/// Accept an invitation addressed to the logged-in person: join its team with its role.
#[utoipa::path(post, path = "/v1/invitations/{id}/accept", tag = "team", security(("bearer" = [])),
    params(("id" = Uuid, Path)),
    responses(
        (status = 201, description = "Joined", body = Member),
        (status = 403, description = "Not a person's session (`forbidden`)", body = ErrorBody),
        (status = 404, description = "No such pending invitation for this person (`not_found`)", body = ErrorBody),
    ))]
async fn accept_invitation(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<(StatusCode, Json<Member>)> {
    let audit = context.action("invitation.accept");
    let mut transaction = state.db.begin().await?;
    let (team_id, member) = invitations::accept(&mut transaction, &principal, id).await?;
    audit
        .record_as(
            &mut transaction,
            Some(team_id),
            "user",
            Some(member.user_id.to_string()),
            Some(format!("invitation:{id}")),
            serde_json::json!({ "role": member.role }),
        )
        .await?;
    transaction.commit().await?;
    Ok((StatusCode::CREATED, Json(member.to_api())))
}

/// Change a member's role. The team always keeps at least one owner. A demotion also
/// lowers the role of the API keys the member created.
#[utoipa::path(patch, path = "/v1/team/members/{user_id}", tag = "team", security(("bearer" = [])),
    params(("user_id" = Uuid, Path)),
    request_body = UpdateMemberRequest,
    responses(
        (status = 200, description = "OK", body = Member),
        (status = 403, description = "Role does not allow this (`forbidden`), or a key with a cap, an expiry or a parent key (`restricted_key`)", body = ErrorBody),
        (status = 404, description = "Not found in the caller's team (`not_found`)", body = ErrorBody),
        (status = 409, description = "Would leave the team without an owner (`last_owner`)", body = ErrorBody),
    ))]
async fn update_member(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(user_id): ApiPath<Uuid>,
    ApiJson(request): ApiJson<UpdateMemberRequest>,
) -> ApiResult<Json<Member>> {
    principal.require_unrestricted("changing a member's role")?;
    let audit = context.action("member.update");
    let mut transaction = state.db.begin().await?;
    let change = teams::change_role(&mut transaction, &principal, user_id, request.role).await?;
    let demoted = request.role.rank() < change.from.rank();
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("user:{user_id}")),
            serde_json::json!({ "from": change.from, "to": request.role }),
        )
        .await?;
    let member = change.member;
    transaction.commit().await?;
    if demoted {
        state
            .auth
            .invalidator
            .publish(Invalidation::Team(principal.team_id))
            .await;
    }
    Ok(Json(member.to_api()))
}

/// Remove a member (admins remove members and admins, owners anyone; anyone may leave).
/// The team always keeps at least one owner. The member's API keys for this team are revoked.
#[utoipa::path(delete, path = "/v1/team/members/{user_id}", tag = "team", security(("bearer" = [])),
    params(("user_id" = Uuid, Path)),
    responses(
        (status = 204, description = "Removed"),
        (status = 403, description = "Role does not allow this (`forbidden`), or a key with a cap, an expiry or a parent key (`restricted_key`)", body = ErrorBody),
        (status = 404, description = "Not found in the caller's team (`not_found`)", body = ErrorBody),
        (status = 409, description = "Would leave the team without an owner (`last_owner`)", body = ErrorBody),
    ))]
async fn remove_member(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(user_id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    principal.require_unrestricted("removing a member")?;
    let audit = context.action("member.remove");
    let mut transaction = state.db.begin().await?;
    let (current_role, revoked) =
        teams::remove_member(&mut transaction, &principal, user_id).await?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("user:{user_id}")),
            serde_json::json!({ "role": current_role, "revoked_api_keys": revoked }),
        )
        .await?;
    transaction.commit().await?;
    state
        .auth
        .invalidator
        .publish(Invalidation::Team(principal.team_id))
        .await;
    Ok(StatusCode::NO_CONTENT)
}
