//! Teams: membership rules (a team always has an owner; only owners make or unmake owners;
//! a key never has more rights than the member who created it) and team settings.

use sandbase_api::sandboxes::EgressPolicy;
use sandbase_api::{Role, TeamSettings, UpdateTeamSettings};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::accounts::{MEMBER_SELECT, MemberRow};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};

/// The team's default egress policy: what a sandbox or run that gives no `egress` gets.
pub async fn default_egress(
    connection: impl sqlx::PgExecutor<'_>,
    team_id: Uuid,
) -> ApiResult<Option<EgressPolicy>> {
    let policy: Option<Option<sqlx::types::Json<EgressPolicy>>> =
        sqlx::query_scalar("SELECT default_egress FROM teams WHERE id = $1")
            .bind(team_id)
            .fetch_optional(connection)
            .await?;
    Ok(policy.flatten().map(|policy| policy.0))
}

/// The team's settings.
pub async fn settings(
    connection: impl sqlx::PgExecutor<'_>,
    team_id: Uuid,
) -> ApiResult<TeamSettings> {
    let record_members_input: bool =
        sqlx::query_scalar("SELECT record_members_input FROM teams WHERE id = $1")
            .bind(team_id)
            .fetch_optional(connection)
            .await?
            .ok_or(ApiError::NotFound("team"))?;
    Ok(TeamSettings {
        record_members_input,
    })
}

/// Changes the settings `change` gives; answers them all as they now are.
pub async fn update_settings(
    connection: &mut PgConnection,
    team_id: Uuid,
    change: &UpdateTeamSettings,
) -> ApiResult<TeamSettings> {
    let record_members_input: bool = sqlx::query_scalar(
        "UPDATE teams SET record_members_input = COALESCE($2, record_members_input) \
         WHERE id = $1 RETURNING record_members_input",
    )
    .bind(team_id)
    .bind(change.record_members_input)
    .fetch_optional(&mut *connection)
    .await?
    .ok_or(ApiError::NotFound("team"))?;
    Ok(TeamSettings {
        record_members_input,
    })
}

/// A role change: the member as it is now, and the role it had.
pub struct RoleChange {
    pub member: MemberRow,
    pub from: Role,
}

/// Changes a member's role. A demotion also lowers the role of the API keys the member
/// created.
pub async fn change_role(
    connection: &mut PgConnection,
    principal: &Principal,
    user_id: Uuid,
    role: Role,
) -> ApiResult<RoleChange> {
    principal.require(Role::Admin)?;
    let from = lock_member(&mut *connection, principal.team_id, user_id).await?;
    if from == Role::Owner || role == Role::Owner {
        principal.require(Role::Owner)?;
    }
    if from == Role::Owner && role != Role::Owner {
        ensure_not_last_owner(&mut *connection, principal.team_id).await?;
    }
    sqlx::query("UPDATE team_members SET role = $3 WHERE team_id = $1 AND user_id = $2")
        .bind(principal.team_id)
        .bind(user_id)
        .bind(role.as_str())
        .execute(&mut *connection)
        .await?;
    if role.rank() < from.rank() {
        // A key never has more rights than the member who created it.
        sqlx::query(
            "UPDATE api_keys SET role = $3 WHERE team_id = $1 AND created_by = $2 \
             AND revoked_at IS NULL AND role <> $3 \
             AND (role = 'owner' OR ($3 = 'member' AND role = 'admin'))",
        )
        .bind(principal.team_id)
        .bind(user_id)
        .bind(role.as_str())
        .execute(&mut *connection)
        .await?;
    }
    let member = find_member(connection, principal.team_id, user_id).await?;
    Ok(RoleChange { member, from })
}

/// Removes a member (admins remove members and admins, owners anyone; anyone may leave) and
/// revokes the API keys it created for this team. Returns its role and how many keys were
/// revoked.
pub async fn remove_member(
    connection: &mut PgConnection,
    principal: &Principal,
    user_id: Uuid,
) -> ApiResult<(Role, u64)> {
    let leaving = principal.user_id() == Some(user_id);
    if !leaving {
        principal.require(Role::Admin)?;
    }
    let role = lock_member(&mut *connection, principal.team_id, user_id).await?;
    if role == Role::Owner {
        if !leaving {
            principal.require(Role::Owner)?;
        }
        ensure_not_last_owner(&mut *connection, principal.team_id).await?;
    }
    sqlx::query("DELETE FROM team_members WHERE team_id = $1 AND user_id = $2")
        .bind(principal.team_id)
        .bind(user_id)
        .execute(&mut *connection)
        .await?;
    let revoked = sqlx::query(
        "UPDATE api_keys SET revoked_at = now() \
         WHERE team_id = $1 AND created_by = $2 AND revoked_at IS NULL",
    )
    .bind(principal.team_id)
    .bind(user_id)
    .execute(&mut *connection)
    .await?
    .rows_affected();
    Ok((role, revoked))
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

pub async fn find_member(
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
        return Err(ApiError::LastOwner);
    }
    Ok(())
}
