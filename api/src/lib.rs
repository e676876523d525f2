//! Wire types of the SandBase HTTP API, shared by the gateway and every client.
//!
//! This crate knows nothing about HTTP frameworks, databases or Redis: it is the
//! JSON contract, with OpenAPI schemas derived from the same definitions.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub mod agent_runs;
pub mod code;
pub mod conversation;
pub mod execs;
pub mod internal;
pub mod previews;
pub mod runs;
pub mod sandboxes;
pub mod secrets;
pub mod segments;
pub mod snapshots;
pub mod store;
pub mod terminals;

/// The body of every error answer: `{"error":{"code":"…","message":"…"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable code such as `invalid_api_key` or `rate_limited`.
    pub code: String,
    /// Human-readable explanation; never contains a secret.
    pub message: String,
    /// The request id, also sent as the `x-request-id` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// A member's role in a team, from most to least privileged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Owner,
    Admin,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }

    /// Privilege rank: higher is more privileged.
    pub fn rank(self) -> u8 {
        match self {
            Role::Owner => 3,
            Role::Admin => 2,
            Role::Member => 1,
        }
    }

    /// True when this role may do everything `other` may.
    pub fn at_least(self, other: Role) -> bool {
        self.rank() >= other.rank()
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "owner" => Ok(Role::Owner),
            "admin" => Ok(Role::Admin),
            "member" => Ok(Role::Member),
            other => Err(format!(
                "unknown role `{other}` (expected owner, admin or member)"
            )),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct User {
    pub id: Uuid,
    pub email: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Team {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// The team's settings (admins change them).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TeamSettings {
    /// Record what members type in their terminal sessions, as admins' and owners' typing
    /// is (off by default: a member's typing may be a password). A session's own
    /// `record_input` still decides for that session.
    pub record_members_input: bool,
}

/// A change to the team's settings: the fields given change, the others stay.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateTeamSettings {
    #[serde(default)]
    pub record_members_input: Option<bool>,
}

/// A team the user belongs to, with the user's role in it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TeamMembership {
    pub team: Team,
    pub role: Role,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SignupRequest {
    #[schema(
        min_length = 3,
        max_length = 254,
        pattern = "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$"
    )]
    pub email: String,
    /// 10 to 256 characters.
    #[schema(min_length = 10, max_length = 256)]
    pub password: String,
    #[schema(
        min_length = 1,
        max_length = 100,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\s\\x00-\\x1f\\x7f-\\x9f][^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    pub team_name: String,
}

/// The answer to a sign-up when the gateway verifies e-mail addresses: the same whether the
/// address was new or already registered (a mail went to it either way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SignupAccepted {
    /// `verification_sent`.
    pub status: String,
    pub email: String,
}

/// The token mailed to a new account's address.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VerifyEmailRequest {
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SignupResponse {
    pub user: User,
    pub team: Team,
    /// The team's first API key. Its `token` is shown only here.
    pub api_key: CreatedApiKey,
    pub session: Session,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoginRequest {
    pub email: String,
    pub password: String,
    /// Team to open the session for; the user's oldest team when absent.
    #[serde(default)]
    pub team_id: Option<Uuid>,
}

/// Another of the session user's teams to open a session for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SwitchTeamRequest {
    pub team_id: Uuid,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoginResponse {
    pub user: User,
    pub team: Team,
    pub role: Role,
    pub session: Session,
    /// Every team the user belongs to.
    pub teams: Vec<TeamMembership>,
}

/// A dashboard session: a short-lived bearer token (JWT, HS256).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

/// Who is calling: answered by `GET /v1/me` for an API key or a session.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Me {
    pub team: Team,
    pub role: Role,
    /// `api_key` or `session`.
    pub auth: AuthKind,
    /// The user behind the session, or the user who created the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<User>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<ApiKey>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthKind {
    ApiKey,
    Session,
}

/// An API key as listed: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiKey {
    pub id: Uuid,
    /// The public part of the key, `sb_<public_id>_…`; safe to show and log.
    pub public_id: String,
    pub name: String,
    pub role: Role,
    #[serde(default)]
    pub created_by: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub last_used_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// Spend cap of the key, in micro-credits: what the sandboxes and calls it makes may cost
    /// in all. At the cap, its sandboxes stop and new ones get 402 `spend_cap_reached`.
    #[serde(default)]
    pub max_credits_micro: Option<i64>,
    /// What the key's sandboxes and calls have cost so far, in micro-credits (not in
    /// `GET /v1/me`, which is answered from a cache).
    #[serde(default)]
    pub spent_micro: Option<i64>,
    /// The store models the key may call (glob patterns such as `openai/*`); absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_models: Option<Vec<String>>,
}

/// A newly created API key, with its full token (shown once).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedApiKey {
    #[serde(flatten)]
    pub key: ApiKey,
    /// `sb_<public_id>_<secret>`; store it now, it cannot be shown again.
    pub token: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKeyRequest {
    #[schema(
        min_length = 1,
        max_length = 100,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\s\\x00-\\x1f\\x7f-\\x9f][^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    pub name: String,
    /// Role of the key; at most the creator's role. Defaults to `member`: ask for `admin` or
    /// `owner` for a key that manages the team (a key with a cap, an expiry or a parent key
    /// never changes membership, whatever its role).
    #[serde(default)]
    pub role: Option<Role>,
    /// Absolute expiry time.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// Expiry relative to now, in seconds. Exclusive with `expires_at`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 315360000)]
    pub expires_in_secs: Option<u64>,
    /// Spend cap in credits (a decimal, e.g. "20"): the key's sandboxes and calls may cost
    /// this much in all.
    #[serde(default)]
    pub max_credits: Option<String>,
    /// The store models the key may call: 1 to 32 patterns where `*` stands for any text
    /// (`openai/*`, `anthropic/claude-*`). A key made by a restricted key is held to its
    /// parent's list as well.
    #[serde(default)]
    #[schema(min_items = 1, max_items = 32)]
    pub allowed_models: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyList {
    pub items: Vec<ApiKey>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Member {
    pub user_id: Uuid,
    pub email: String,
    pub role: Role,
    pub joined_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemberList {
    pub items: Vec<Member>,
}

/// An invitation to join a team: nothing changes until the invitee accepts it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Invitation {
    pub id: Uuid,
    pub team: Team,
    pub email: String,
    pub role: Role,
    pub invited_by: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InvitationList {
    pub items: Vec<Invitation>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMemberRequest {
    /// E-mail of the person to invite (whether or not they have an account yet).
    #[schema(
        min_length = 3,
        max_length = 254,
        pattern = "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$"
    )]
    pub email: String,
    #[serde(default = "default_member_role")]
    pub role: Role,
}

fn default_member_role() -> Role {
    Role::Member
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateMemberRequest {
    pub role: Role,
}

/// One append-only audit record.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditEvent {
    pub id: i64,
    pub occurred_at: DateTime<Utc>,
    #[serde(default)]
    pub team_id: Option<Uuid>,
    /// `user`, `api_key` or `anonymous`.
    pub actor_type: String,
    #[serde(default)]
    pub actor_id: Option<String>,
    /// Dotted action name such as `api_key.create` or `auth.failed`.
    pub action: String,
    #[serde(default)]
    pub target: Option<String>,
    #[serde(default)]
    pub source_ip: Option<String>,
    #[serde(default)]
    pub request_id: Option<String>,
    /// `success`, `failure` or `denied`.
    pub outcome: String,
    #[serde(default)]
    pub status_code: Option<i32>,
    /// What the action was about (ids, names, counts; never a secret), e.g. a terminal
    /// session's `recording`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    pub items: Vec<AuditEvent>,
    /// Pass as `cursor` to get the next (older) page; absent on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    /// `ok`, `unavailable` (PostgreSQL or Redis is not answering) or `draining` (shutting
    /// down: still serving, leaving the load balancer's rotation).
    pub status: String,
    pub postgres: String,
    pub redis: String,
}

pub mod billing;
