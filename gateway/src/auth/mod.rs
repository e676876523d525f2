//! Who is calling: [`Principal`] (team, role, actor) and its role checks. `authenticate`
//! turns a bearer token into one (API keys and dashboard sessions) and counts the request
//! against the caller's rate limit; the HTTP layer makes it an extractor.

pub mod abuse;
pub mod api_key;
pub mod authenticate;
pub mod key_cache;
pub mod password;
pub mod session;
pub mod store_token;

use std::sync::Arc;

use sandbase_api::Role;
use uuid::Uuid;

use crate::error::ApiError;
use api_key::KeyRecord;

/// Who is calling, for which team, with which role. Extracting it authenticates the
/// request and counts it against the caller's rate limit.
#[derive(Debug, Clone)]
pub struct Principal {
    pub team_id: Uuid,
    pub role: Role,
    pub actor: Actor,
    /// The team's rate limit (per second, burst); the configured default when `None`.
    pub rate_limit: Option<(u32, u32)>,
}

#[derive(Debug, Clone)]
pub enum Actor {
    /// The key's cached record.
    ApiKey(Arc<KeyRecord>),
    User {
        id: Uuid,
    },
}

impl Principal {
    /// `forbidden` unless the caller's role is at least `role`.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role.at_least(role) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this action needs the {role} role; the caller has {}",
                self.role
            )))
        }
    }

    /// `restricted_key` for a key with a spend cap, an expiry or a parent key: such a key is
    /// given to automation with a bound, and `action` (a membership change) would let it
    /// bring in someone free of that bound. People (sessions) and unrestricted keys pass.
    pub fn require_unrestricted(&self, action: &str) -> Result<(), ApiError> {
        let Actor::ApiKey(record) = &self.actor else {
            return Ok(());
        };
        let bound = if record.max_credits.is_some() {
            Some("a spend cap")
        } else if record.expires_at.is_some() {
            Some("an expiry")
        } else if record.has_parent {
            Some("a parent key")
        } else {
            None
        };
        match bound {
            Some(bound) => Err(ApiError::RestrictedKey(format!(
                "{action} is not allowed to a key with {bound}: use the dashboard or an unrestricted key"
            ))),
            None => Ok(()),
        }
    }

    /// The user acting: the session's user, or the key's creator.
    pub fn user_id(&self) -> Option<Uuid> {
        match &self.actor {
            Actor::User { id } => Some(*id),
            Actor::ApiKey(record) => record.created_by,
        }
    }

    /// The API key calling, if a key is.
    pub fn api_key_id(&self) -> Option<Uuid> {
        match &self.actor {
            Actor::ApiKey(record) => Some(record.id),
            Actor::User { .. } => None,
        }
    }

    pub fn actor_type(&self) -> &'static str {
        match self.actor {
            Actor::ApiKey(_) => "api_key",
            Actor::User { .. } => "user",
        }
    }

    pub fn actor_id(&self) -> String {
        match &self.actor {
            Actor::ApiKey(record) => record.id.to_string(),
            Actor::User { id } => id.to_string(),
        }
    }
}
