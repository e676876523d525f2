//! Team members and roles. Membership changes lock the team row, so two concurrent
//! changes cannot together remove the last owner.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandbase_api::{AddMemberRequest, ErrorBody, Member, MemberList, Role, UpdateMemberRequest};
use sqlx::PgConnection;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::accounts::{self, MEMBER_SELECT, MemberRow};
use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::auth::api_key::Invalidation;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_members, add_member))
        .routes(routes!(get_member, update_member, remove_member))
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

/// Add an existing user (by e-mail) to the team. Admins add members and admins; owners also owners.
#[utoipa::path(post, path = "/v1/team/members", tag = "team", security(("bearer" = [])),
    request_body = AddMemberRequest,
    responses(
        (status = 201, description = "Created", body = Member),
        (status = 403, description = "Role does not allow this (`forbidden`)", body = ErrorBody),
        (status = 404, description = "No user with this e-mail", body = ErrorBody),
        (status = 409, description = "Already a member (`already_member`)", body = ErrorBody),
    ))]
async fn add_member(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(request): ApiJson<AddMemberRequest>,
) -> ApiResult<(StatusCode, Json<Member>)> {
    principal.require(Role::Admin)?;
    if request.role == Role::Owner {
        principal.require(Role::Owner)?;
    }
    let email = accounts::parse_email(&request.email)?;
    let mut transaction = state.db.begin().await?;
    lock_team(&mut transaction, principal.team_id).await?;
    let user = accounts::find_user_by_email(&mut transaction, &email)
        .await?
        .ok_or(ApiError::NotFound("user"))?;
    let inserted = sqlx::query(
        "INSERT INTO team_members (team_id, user_id, role) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
    )
    .bind(principal.team_id)
    .bind(user.id)
    .bind(request.role.as_str())
    .execute(&mut *transaction)
    .await?;
    if inserted.rows_affected() == 0 {
        return Err(ApiError::Conflict {
            code: "already_member",
            message: format!("{email} is already a member of this team"),
        });
    }
    context
        .record(
            &mut transaction,
            &principal,
            Some(format!("user:{}", user.id)),
            serde_json::json!({ "role": request.role }),
        )
        .await?;
    let member = find_member(&mut transaction, principal.team_id, user.id).await?;
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
        (status = 403, description = "Role does not allow this (`forbidden`)", body = ErrorBody),
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
    principal.require(Role::Admin)?;
    let mut transaction = state.db.begin().await?;
    let current_role = lock_member(&mut transaction, principal.team_id, user_id).await?;
    if current_role == Role::Owner || request.role == Role::Owner {
        principal.require(Role::Owner)?;
    }
    if current_role == Role::Owner && request.role != Role::Owner {
        ensure_not_last_owner(&mut transaction, principal.team_id).await?;
    }
    sqlx::query("UPDATE team_members SET role = $3 WHERE team_id = $1 AND user_id = $2")
        .bind(principal.team_id)
        .bind(user_id)
        .bind(request.role.as_str())
        .execute(&mut *transaction)
        .await?;
    let demoted = request.role.rank() < current_role.rank();
    if demoted {
        // A key never has more rights than the member who created it.
        sqlx::query(
            "UPDATE api_keys SET role = $3 WHERE team_id = $1 AND created_by = $2 \
             AND revoked_at IS NULL AND role <> $3 \
             AND (role = 'owner' OR ($3 = 'member' AND role = 'admin'))",
        )
        .bind(principal.team_id)
        .bind(user_id)
        .bind(request.role.as_str())
        .execute(&mut *transaction)
        .await?;
    }
    context
        .record(
            &mut transaction,
            &principal,
            Some(format!("user:{user_id}")),
            serde_json::json!({ "from": current_role, "to": request.role }),
        )
        .await?;
    let member = find_member(&mut transaction, principal.team_id, user_id).await?;
    transaction.commit().await?;
    if demoted {
        state
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
        (status = 403, description = "Role does not allow this (`forbidden`)", body = ErrorBody),
        (status = 404, description = "Not found in the caller's team (`not_found`)", body = ErrorBody),
        (status = 409, description = "Would leave the team without an owner (`last_owner`)", body = ErrorBody),
    ))]
async fn remove_member(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(user_id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    let leaving = principal.user_id() == Some(user_id);
    if !leaving {
        principal.require(Role::Admin)?;
    }
    let mut transaction = state.db.begin().await?;
    let current_role = lock_member(&mut transaction, principal.team_id, user_id).await?;
    if current_role == Role::Owner {
        if !leaving {
            principal.require(Role::Owner)?;
        }
        ensure_not_last_owner(&mut transaction, principal.team_id).await?;
    }
    sqlx::query("DELETE FROM team_members WHERE team_id = $1 AND user_id = $2")
        .bind(principal.team_id)
        .bind(user_id)
        .execute(&mut *transaction)
        .await?;
    let revoked = sqlx::query(
        "UPDATE api_keys SET revoked_at = now() \
         WHERE team_id = $1 AND created_by = $2 AND revoked_at IS NULL",
    )
    .bind(principal.team_id)
    .bind(user_id)
    .execute(&mut *transaction)
    .await?
    .rows_affected();
    context
        .record(
            &mut transaction,
            &principal,
            Some(format!("user:{user_id}")),
            serde_json::json!({ "role": current_role, "revoked_api_keys": revoked }),
        )
        .await?;
    transaction.commit().await?;
    state
        .invalidator
        .publish(Invalidation::Team(principal.team_id))
        .await;
    Ok(StatusCode::NO_CONTENT)
}

async fn lock_team(connection: &mut PgConnection, team_id: Uuid) -> ApiResult<()> {
    sqlx::query("SELECT id FROM teams WHERE id = $1 FOR UPDATE")
        .bind(team_id)
        .fetch_optional(&mut *connection)
        .await?
        .ok_or(ApiError::NotFound("team"))?;
    Ok(())
}

/// Locks the team and returns the role of one of its members.
async fn lock_member(
    connection: &mut PgConnection,
    team_id: Uuid,
    user_id: Uuid,
) -> ApiResult<Role> {
    lock_team(&mut *connection, team_id).await?;
    let member = find_member(connection, team_id, user_id).await?;
    Ok(member
        .role
        .parse()
        .map_err(|error: String| anyhow::anyhow!(error))?)
}

async fn find_member(
    connection: &mut PgConnection,
    team_id: Uuid,
    user_id: Uuid,
) -> ApiResult<MemberRow> {
    sqlx::query_as(&format!(
        "{MEMBER_SELECT} WHERE m.team_id = $1 AND m.user_id = $2"
    ))
    .bind(team_id)
    .bind(user_id)
    .fetch_optional(connection)
    .await?
    .ok_or(ApiError::NotFound("member"))
}

async fn ensure_not_last_owner(connection: &mut PgConnection, team_id: Uuid) -> ApiResult<()> {
    let owners: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM team_members WHERE team_id = $1 AND role = 'owner'",
    )
    .bind(team_id)
    .fetch_one(connection)
    .await?;
    if owners <= 1 {
        return Err(ApiError::Conflict {
            code: "last_owner",
            message: "a team needs at least one owner: make someone else owner first".to_owned(),
        });
    }
    Ok(())
}
