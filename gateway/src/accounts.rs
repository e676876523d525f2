//! Account, team and API-key records: the queries shared by the HTTP handlers and the
//! `dev` bootstrap. Every query that reads or writes team data takes the team id.

use chrono::{DateTime, Utc};
use sandbase_api::{ApiKey, CreatedApiKey, Member, Role, Team, User};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::auth::api_key::ApiKeyToken;
use crate::error::{ApiError, map_unique_violation};

#[derive(sqlx::FromRow)]
pub struct UserRow {
    pub id: Uuid,
    pub email: String,
    pub password_hash: String,
    pub created_at: DateTime<Utc>,
}

impl UserRow {
    pub fn to_api(&self) -> User {
        User {
            id: self.id,
            email: self.email.clone(),
            created_at: self.created_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub struct TeamRow {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

impl From<TeamRow> for Team {
    fn from(row: TeamRow) -> Team {
        Team {
            id: row.id,
            name: row.name,
            created_at: row.created_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub struct ApiKeyRow {
    pub id: Uuid,
    pub public_id: String,
    pub name: String,
    pub role: String,
    pub created_by: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub max_credits: Option<i64>,
    pub spent_micro: i64,
    pub allowed_models: Option<Vec<String>>,
}

impl ApiKeyRow {
    pub fn to_api(&self) -> ApiKey {
        ApiKey {
            id: self.id,
            public_id: self.public_id.clone(),
            name: self.name.clone(),
            role: self.role.parse().unwrap_or(Role::Member),
            created_by: self.created_by,
            created_at: self.created_at,
            last_used_at: self.last_used_at,
            expires_at: self.expires_at,
            max_credits_micro: self.max_credits,
            spent_micro: Some(self.spent_micro),
            allowed_models: self.allowed_models.clone(),
        }
    }
}

pub const API_KEY_COLUMNS: &str = "id, public_id, name, role, created_by, created_at, last_used_at, expires_at, \
     max_credits, spent_micro, allowed_models";

/// Normalizes and checks an e-mail address: trimmed, one `@`, a dot in the domain, no spaces.
pub fn parse_email(email: &str) -> Result<String, ApiError> {
    let email = email.trim();
    // The document's pattern: ASCII, the local part's usual characters, a host name of two
    // labels or more.
    let valid = email.len() <= 254
        && email.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty()
                && local
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+/=?^_`{|}~.-".contains(&b))
                && domain.split('.').count() >= 2
                && domain.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                })
        });
    if valid {
        Ok(email.to_owned())
    } else {
        Err(ApiError::InvalidRequest(format!(
            "`email` is not a valid e-mail address: {email:?}"
        )))
    }
}

/// Checks a display name (team or key): 1 to 100 characters, no control characters.
pub fn parse_name(field: &str, name: &str) -> Result<String, ApiError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::InvalidRequest(format!(
            "`{field}` must be 1 to 100 characters without control characters"
        )));
    }
    Ok(name.to_owned())
}

/// Creates a user, a team, and the user's owner membership.
/// Makes a user and their team; `verified`: whether the address counts as proved already
/// (always, unless the gateway verifies e-mail addresses).
pub async fn create_user_with_team(
    connection: &mut PgConnection,
    email: &str,
    password_hash: &str,
    team_name: &str,
    verified: bool,
) -> Result<(UserRow, TeamRow), ApiError> {
    let user: UserRow = sqlx::query_as(
        "INSERT INTO users (id, email, password_hash, email_verified_at) \
         VALUES ($1, $2, $3, CASE WHEN $4 THEN now() END) \
         RETURNING id, email, password_hash, created_at",
    )
    .bind(Uuid::now_v7())
    .bind(email)
    .bind(password_hash)
    .bind(verified)
    .fetch_one(&mut *connection)
    .await
    .map_err(|error| map_unique_violation(error, ApiError::EmailTaken))?;
    let team: TeamRow = sqlx::query_as(
        "INSERT INTO teams (id, name) VALUES ($1, $2) RETURNING id, name, created_at",
    )
    .bind(Uuid::now_v7())
    .bind(team_name)
    .fetch_one(&mut *connection)
    .await?;
    sqlx::query("INSERT INTO team_members (team_id, user_id, role) VALUES ($1, $2, 'owner')")
        .bind(team.id)
        .bind(user.id)
        .execute(&mut *connection)
        .await?;
    Ok((user, team))
}

/// Creates an API key and returns it with its token (to be shown once).
pub async fn create_api_key(
    connection: &mut PgConnection,
    team_id: Uuid,
    name: &str,
    role: Role,
    created_by: Option<Uuid>,
    expires_at: Option<DateTime<Utc>>,
) -> Result<CreatedApiKey, ApiError> {
    let token = ApiKeyToken::generate();
    let row: ApiKeyRow = sqlx::query_as(&format!(
        "INSERT INTO api_keys (id, team_id, public_id, secret_hash, name, role, created_by, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {API_KEY_COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(team_id)
    .bind(&token.public_id)
    .bind(token.secret_hash().as_slice())
    .bind(name)
    .bind(role.as_str())
    .bind(created_by)
    .bind(expires_at)
    .fetch_one(&mut *connection)
    .await?;
    Ok(CreatedApiKey {
        key: row.to_api(),
        token: token.reveal(),
    })
}

pub async fn find_user_by_email(
    connection: &mut PgConnection,
    email: &str,
) -> Result<Option<UserRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, email, password_hash, created_at FROM users WHERE lower(email) = lower($1)",
    )
    .bind(email)
    .fetch_optional(connection)
    .await
}

pub async fn find_user(
    connection: &mut PgConnection,
    id: Uuid,
) -> Result<Option<UserRow>, sqlx::Error> {
    sqlx::query_as("SELECT id, email, password_hash, created_at FROM users WHERE id = $1")
        .bind(id)
        .fetch_optional(connection)
        .await
}

pub async fn find_team(
    connection: &mut PgConnection,
    id: Uuid,
) -> Result<Option<TeamRow>, sqlx::Error> {
    sqlx::query_as("SELECT id, name, created_at FROM teams WHERE id = $1")
        .bind(id)
        .fetch_optional(connection)
        .await
}

#[derive(sqlx::FromRow)]
pub struct MemberRow {
    pub user_id: Uuid,
    pub email: String,
    pub role: String,
    pub joined_at: DateTime<Utc>,
}

impl MemberRow {
    pub fn to_api(&self) -> Member {
        Member {
            user_id: self.user_id,
            email: self.email.clone(),
            role: self.role.parse().unwrap_or(Role::Member),
            joined_at: self.joined_at,
        }
    }
}

pub const MEMBER_SELECT: &str = "SELECT m.user_id, u.email, m.role, m.created_at AS joined_at \
     FROM team_members m JOIN users u ON u.id = m.user_id";

/// Every team a user belongs to, oldest membership first.
pub async fn memberships(
    connection: &mut PgConnection,
    user_id: Uuid,
) -> Result<Vec<(TeamRow, String)>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: Uuid,
        name: String,
        created_at: DateTime<Utc>,
        role: String,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT t.id, t.name, t.created_at, m.role FROM team_members m \
         JOIN teams t ON t.id = m.team_id WHERE m.user_id = $1 ORDER BY m.created_at, t.id",
    )
    .bind(user_id)
    .fetch_all(connection)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            (
                TeamRow {
                    id: row.id,
                    name: row.name,
                    created_at: row.created_at,
                },
                row.role,
            )
        })
        .collect())
}
