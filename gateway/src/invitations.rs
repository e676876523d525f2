//! Invitations: an admin asks a person (by e-mail) to join the team, and the person joins
//! only by accepting, logged in as the owner of that address. Inviting answers the same
//! whether the address has an account or not, so it tells an admin nothing about who uses
//! SandBase, and nobody is put in a team without consent.

use chrono::{DateTime, Duration, Utc};
use sandbase_api::{Invitation, Role, Team};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::accounts;
use crate::accounts::MemberRow;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::teams::find_member;

/// How long an invitation can be accepted.
const VALID_DAYS: i64 = 7;

#[derive(sqlx::FromRow)]
pub struct InvitationRow {
    pub id: Uuid,
    pub team_id: Uuid,
    pub team_name: String,
    pub team_created_at: DateTime<Utc>,
    pub email: String,
    pub role: String,
    pub invited_by: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl InvitationRow {
    pub fn to_api(&self) -> Invitation {
        Invitation {
            id: self.id,
            team: Team {
                id: self.team_id,
                name: self.team_name.clone(),
                created_at: self.team_created_at,
            },
            email: self.email.clone(),
            role: self.role.parse().unwrap_or(Role::Member),
            invited_by: self.invited_by,
            created_at: self.created_at,
            expires_at: self.expires_at,
        }
    }
}

const SELECT: &str = "SELECT i.id, i.team_id, t.name AS team_name, t.created_at AS team_created_at, \
     i.email, i.role, i.invited_by, i.created_at, i.expires_at \
     FROM team_invitations i JOIN teams t ON t.id = i.team_id";

/// Invites `email` to the caller's team as `role` (admins invite members and admins, owners
/// anyone); inviting the same address again renews the invitation.
pub async fn invite(
    connection: &mut PgConnection,
    principal: &Principal,
    email: &str,
    role: Role,
) -> ApiResult<InvitationRow> {
    principal.require(Role::Admin)?;
    if role == Role::Owner {
        principal.require(Role::Owner)?;
    }
    let email = accounts::parse_email(email)?;
    let member: Option<Uuid> = sqlx::query_scalar(
        "SELECT m.user_id FROM team_members m JOIN users u ON u.id = m.user_id \
         WHERE m.team_id = $1 AND lower(u.email) = lower($2)",
    )
    .bind(principal.team_id)
    .bind(&email)
    .fetch_optional(&mut *connection)
    .await?;
    if member.is_some() {
        return Err(ApiError::AlreadyMember(email));
    }
    let invited_by = match &principal.actor {
        crate::auth::Actor::User { id } => Some(*id),
        crate::auth::Actor::ApiKey(record) => record.created_by,
    };
    let id: Uuid = sqlx::query_scalar(
        "INSERT INTO team_invitations (id, team_id, email, role, invited_by, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (team_id, lower(email)) WHERE accepted_at IS NULL \
         DO UPDATE SET role = EXCLUDED.role, invited_by = EXCLUDED.invited_by, \
                       created_at = now(), expires_at = EXCLUDED.expires_at \
         RETURNING id",
    )
    .bind(Uuid::now_v7())
    .bind(principal.team_id)
    .bind(&email)
    .bind(role.as_str())
    .bind(invited_by)
    .bind(Utc::now() + Duration::days(VALID_DAYS))
    .fetch_one(&mut *connection)
    .await?;
    fetch(connection, id).await
}

async fn fetch(connection: &mut PgConnection, id: Uuid) -> ApiResult<InvitationRow> {
    sqlx::query_as(&format!("{SELECT} WHERE i.id = $1"))
        .bind(id)
        .fetch_optional(connection)
        .await?
        .ok_or(ApiError::NotFound("invitation"))
}

/// The pending, unexpired invitations of the team.
pub async fn of_team(
    connection: &mut PgConnection,
    team_id: Uuid,
) -> ApiResult<Vec<InvitationRow>> {
    Ok(sqlx::query_as(&format!(
        "{SELECT} WHERE i.team_id = $1 AND i.accepted_at IS NULL AND i.expires_at > now() \
         ORDER BY i.created_at"
    ))
    .bind(team_id)
    .fetch_all(connection)
    .await?)
}

/// The pending, unexpired invitations addressed to the calling person.
pub async fn for_person(
    connection: &mut PgConnection,
    principal: &Principal,
) -> ApiResult<Vec<InvitationRow>> {
    let user = person(connection, principal).await?;
    Ok(sqlx::query_as(&format!(
        "{SELECT} WHERE lower(i.email) = lower($1) AND i.accepted_at IS NULL \
         AND i.expires_at > now() ORDER BY i.created_at"
    ))
    .bind(&user.email)
    .fetch_all(connection)
    .await?)
}

/// Accepts an invitation addressed to the calling person: they join its team with its role.
/// Returns the team and the new member.
pub async fn accept(
    connection: &mut PgConnection,
    principal: &Principal,
    id: Uuid,
) -> ApiResult<(Uuid, MemberRow)> {
    let user = person(connection, principal).await?;
    let invitation: Option<(Uuid, String)> = sqlx::query_as(
        "SELECT team_id, role FROM team_invitations \
         WHERE id = $1 AND lower(email) = lower($2) AND accepted_at IS NULL \
         AND expires_at > now() FOR UPDATE",
    )
    .bind(id)
    .bind(&user.email)
    .fetch_optional(&mut *connection)
    .await?;
    // Someone else's invitation is as unknown as a made-up one.
    let (team_id, role) = invitation.ok_or(ApiError::NotFound("invitation"))?;
    sqlx::query("UPDATE team_invitations SET accepted_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut *connection)
        .await?;
    sqlx::query(
        "INSERT INTO team_members (team_id, user_id, role) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
    )
    .bind(team_id)
    .bind(user.id)
    .bind(role)
    .execute(&mut *connection)
    .await?;
    Ok((team_id, find_member(connection, team_id, user.id).await?))
}

/// The person behind a principal: invitations are for people, through their own session.
async fn person(
    connection: &mut PgConnection,
    principal: &Principal,
) -> ApiResult<accounts::UserRow> {
    let crate::auth::Actor::User { id } = &principal.actor else {
        return Err(ApiError::Forbidden(
            "invitations are answered by a person: log in (a dashboard session), not an API key"
                .to_owned(),
        ));
    };
    accounts::find_user(connection, *id)
        .await?
        .ok_or(ApiError::InvalidSession)
}
