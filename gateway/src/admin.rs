//! Operator actions that act on the database directly (the `sandbase admin` commands).

use sqlx::PgPool;
use uuid::Uuid;

use crate::auth::key_cache::{Invalidation, Invalidator, KeyCache};

/// Sets (or with `None`, clears) a team's rate limit, and tells every gateway.
pub async fn set_team_rate_limit(
    db: &PgPool,
    redis: redis::aio::ConnectionManager,
    key_prefix: &str,
    team_id: Uuid,
    limit: Option<(u32, u32)>,
) -> anyhow::Result<()> {
    let (per_second, burst) = match limit {
        Some((per_second, burst)) => (
            Some(i32::try_from(per_second)?),
            Some(i32::try_from(burst)?),
        ),
        None => (None, None),
    };
    let updated = sqlx::query(
        "UPDATE teams SET rate_limit_per_sec = $2, rate_limit_burst = $3 WHERE id = $1",
    )
    .bind(team_id)
    .bind(per_second)
    .bind(burst)
    .execute(db)
    .await?;
    anyhow::ensure!(updated.rows_affected() == 1, "no team with id {team_id}");
    let invalidator = Invalidator::new(
        redis,
        crate::startup::invalidation_channel(key_prefix),
        std::sync::Arc::new(KeyCache::new(1, std::time::Duration::ZERO)),
    );
    invalidator.publish(Invalidation::Team(team_id)).await;
    Ok(())
}

/// Sets (or with `None`, clears back to `sandboxes.max_per_team`) how many sandboxes a
/// team may have at once.
pub async fn set_team_sandbox_quota(
    db: &PgPool,
    team_id: Uuid,
    max: Option<u32>,
) -> anyhow::Result<()> {
    let max = max.map(i32::try_from).transpose()?;
    anyhow::ensure!(max.is_none_or(|max| max >= 1), "a quota is at least 1");
    let updated = sqlx::query("UPDATE teams SET max_sandboxes = $2 WHERE id = $1")
        .bind(team_id)
        .bind(max)
        .execute(db)
        .await?;
    anyhow::ensure!(updated.rows_affected() == 1, "no team with id {team_id}");
    Ok(())
}
