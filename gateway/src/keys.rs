//! API key lineage. A key made by a key is its child: its role, cap and expiry are at most
//! its parent's (the cap at most what the parent has left), revoking a key revokes its
//! descendants, and what a key spends counts against each of its ancestors' caps. Who may
//! revoke a key follows roles and lineage: a key its own descendants (and itself), an admin
//! or owner the keys of a role no higher than theirs, a person the keys they made.

use chrono::{DateTime, Utc};
use sandbase_api::Role;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::auth::{Actor, Principal};
use crate::error::{ApiError, ApiResult};

/// The key a new key is made with, as it stands now (locked until the new key is written).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Parent {
    pub id: Uuid,
    pub lineage: Vec<Uuid>,
    pub max_credits: Option<i64>,
    pub spent_micro: i64,
    pub expires_at: Option<DateTime<Utc>>,
}

impl Parent {
    /// The child's lineage: its parent, then the parent's ancestors.
    pub fn child_lineage(&self) -> Vec<Uuid> {
        std::iter::once(self.id)
            .chain(self.lineage.iter().copied())
            .collect()
    }
}

/// The parent of a key `principal` makes: its own key, when it calls with one.
pub async fn parent_of(
    connection: &mut PgConnection,
    principal: &Principal,
) -> Result<Option<Parent>, sqlx::Error> {
    let Actor::ApiKey(record) = &principal.actor else {
        return Ok(None);
    };
    sqlx::query_as(
        "SELECT id, lineage, max_credits, spent_micro, expires_at FROM api_keys \
         WHERE id = $1 FOR UPDATE",
    )
    .bind(record.id)
    .fetch_optional(connection)
    .await
}

/// The same, read without locking the parent's row: for a key the harness makes for a run
/// in a transaction that also inserts rows naming the team (the parent's lock taken first
/// would order it against the charger and placement the other way round: a deadlock under
/// load). A cap bounded by a slightly stale `spent_micro` is safe: a child's spending counts
/// against its parent's cap as well.
pub async fn parent_unlocked(
    connection: &mut PgConnection,
    principal: &Principal,
) -> Result<Option<Parent>, sqlx::Error> {
    let Actor::ApiKey(record) = &principal.actor else {
        return Ok(None);
    };
    sqlx::query_as(
        "SELECT id, lineage, max_credits, spent_micro, expires_at FROM api_keys WHERE id = $1",
    )
    .bind(record.id)
    .fetch_optional(connection)
    .await
}

/// The cap and expiry of a child key: what was asked for, within the parent's; what was not
/// asked for, the parent's (its remaining cap, its expiry). Asking for more is refused.
pub fn bound_by_parent(
    parent: &Parent,
    cap: Option<i64>,
    expires_at: Option<DateTime<Utc>>,
) -> ApiResult<(Option<i64>, Option<DateTime<Utc>>)> {
    let remaining = parent
        .max_credits
        .map(|max| (max - parent.spent_micro).max(0));
    let cap = match (cap, remaining) {
        (Some(asked), Some(left)) if asked > left => {
            return Err(ApiError::ExceedsParentKey(format!(
                "`max_credits` is more than the {left} micro-credits the key making it has left"
            )));
        }
        (Some(asked), _) => Some(asked),
        (None, left) => left,
    };
    let expires_at = match (expires_at, parent.expires_at) {
        (Some(asked), Some(parent_expiry)) if asked > parent_expiry => {
            return Err(ApiError::ExceedsParentKey(format!(
                "the key would outlive the key making it, which expires at {parent_expiry}"
            )));
        }
        (Some(asked), _) => Some(asked),
        (None, parent_expiry) => parent_expiry,
    };
    Ok((cap, expires_at))
}

/// A key as revocation sees it.
#[derive(sqlx::FromRow)]
struct Target {
    id: Uuid,
    role: String,
    created_by: Option<Uuid>,
    lineage: Vec<Uuid>,
}

/// Whether `principal` may revoke `target`.
fn may_revoke(principal: &Principal, target: &Target) -> bool {
    let target_role: Role = target.role.parse().unwrap_or(Role::Owner);
    let by_role = principal.role.at_least(Role::Admin) && principal.role.at_least(target_role);
    match &principal.actor {
        Actor::ApiKey(record) => {
            by_role || target.id == record.id || target.lineage.contains(&record.id)
        }
        Actor::User { id } => by_role || target.created_by == Some(*id),
    }
}

/// Revokes a key of the caller's team and every key descended from it; returns their
/// public ids (for the caches of every gateway).
pub async fn revoke(
    connection: &mut PgConnection,
    principal: &Principal,
    id: Uuid,
) -> ApiResult<Vec<String>> {
    let target: Target = sqlx::query_as(
        "SELECT id, role, created_by, lineage FROM api_keys \
         WHERE id = $1 AND team_id = $2 AND revoked_at IS NULL FOR UPDATE",
    )
    .bind(id)
    .bind(principal.team_id)
    .fetch_optional(&mut *connection)
    .await?
    .ok_or(ApiError::NotFound("API key"))?;
    if !may_revoke(principal, &target) {
        return Err(ApiError::Forbidden(
            "a key may be revoked by its own lineage, by the person who made it, or by an admin or owner of at least its role".to_owned(),
        ));
    }
    let revoked: Vec<String> = sqlx::query_scalar(
        "UPDATE api_keys SET revoked_at = now() \
         WHERE team_id = $1 AND revoked_at IS NULL AND (id = $2 OR $2 = ANY(lineage)) \
         RETURNING public_id",
    )
    .bind(principal.team_id)
    .bind(id)
    .fetch_all(connection)
    .await?;
    Ok(revoked)
}

/// A key and its ancestors (whose caps its spending counts against), the key first.
pub async fn with_ancestors(
    connection: impl sqlx::PgExecutor<'_>,
    key: Option<Uuid>,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let Some(key) = key else {
        return Ok(Vec::new());
    };
    let lineage: Option<Vec<Uuid>> =
        sqlx::query_scalar("SELECT lineage FROM api_keys WHERE id = $1")
            .bind(key)
            .fetch_optional(connection)
            .await?;
    Ok(std::iter::once(key)
        .chain(lineage.unwrap_or_default())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent(max_credits: Option<i64>, spent: i64, expires_at: Option<DateTime<Utc>>) -> Parent {
        Parent {
            id: Uuid::nil(),
            lineage: Vec::new(),
            max_credits,
            spent_micro: spent,
            expires_at,
        }
    }

    #[test]
    fn a_child_gets_at_most_what_its_parent_has_left() {
        let soon = Utc::now() + chrono::Duration::hours(1);
        let later = soon + chrono::Duration::hours(1);
        let capped = parent(Some(1_000), 400, Some(soon));
        assert_eq!(
            bound_by_parent(&capped, None, None).unwrap(),
            (Some(600), Some(soon))
        );
        assert_eq!(
            bound_by_parent(&capped, Some(600), None).unwrap(),
            (Some(600), Some(soon))
        );
        assert!(bound_by_parent(&capped, Some(601), None).is_err());
        assert!(bound_by_parent(&capped, None, Some(later)).is_err());
        let now = Utc::now();
        assert_eq!(
            bound_by_parent(&capped, Some(1), Some(now)).unwrap(),
            (Some(1), Some(now))
        );
        // An overspent parent leaves nothing, not a negative cap.
        assert_eq!(
            bound_by_parent(&parent(Some(10), 50, None), None, None)
                .unwrap()
                .0,
            Some(0)
        );
        // A parent with no cap and no expiry bounds nothing.
        let free = parent(None, 0, None);
        assert_eq!(bound_by_parent(&free, None, None).unwrap(), (None, None));
        assert_eq!(
            bound_by_parent(&free, Some(5), Some(later)).unwrap(),
            (Some(5), Some(later))
        );
    }
}
