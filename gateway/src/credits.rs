//! The gateway's use of the ledger: starter credits for new teams and grant expiry.

use chrono::{Duration, Utc};
use sandbase_billing::{Credits, GrantSource, NewGrant};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::config::BillingSettings;

/// Grants a new team its starter credits (in the sign-up's own transaction).
pub async fn grant_starter(
    connection: &mut PgConnection,
    team_id: Uuid,
    settings: &BillingSettings,
) -> Result<(), sqlx::Error> {
    let amount = Credits::parse(&settings.starter_credits).unwrap_or_default();
    if amount.0 <= 0 {
        return Ok(());
    }
    let expires_at = (settings.starter_expiry_days > 0)
        .then(|| Utc::now() + Duration::days(i64::from(settings.starter_expiry_days)));
    sandbase_billing::grant(
        connection,
        NewGrant {
            team_id,
            source: GrantSource::Starter,
            amount,
            priority: 0,
            effective_at: None,
            expires_at,
            idempotency_key: format!("starter:{team_id}"),
            description: "starter credits".to_owned(),
            details: serde_json::json!({}),
        },
    )
    .await?;
    Ok(())
}
