//! An agent run's own key: made in the run's create transaction as a child of the creator's
//! key (for a person, a root key of their role), capped at the run's `max_credits`; its
//! token sealed by the vault with the team's data key, opened only by the gateway stepping
//! the run, never stored in clear or logged.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::accounts;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::keys;
use crate::secrets::vault_error;

/// The new key's id and its token sealed (nonce, ciphertext).
pub struct Sealed {
    pub key_id: Uuid,
    pub nonce: Vec<u8>,
    pub sealed: Vec<u8>,
}

fn label(run_id: Uuid) -> String {
    format!("agent-run-key/{run_id}")
}

/// Makes the run's key within the caller's transaction.
pub async fn mint(
    connection: &mut PgConnection,
    keyring: &sandbase_vault::Keyring,
    principal: &Principal,
    run_id: Uuid,
    max_credits: Option<i64>,
) -> ApiResult<Sealed> {
    let parent = keys::parent_unlocked(connection, principal).await?;
    let (max_credits, expires_at): (Option<i64>, Option<DateTime<Utc>>) = match &parent {
        Some(parent) => keys::bound_by_parent(parent, max_credits, None)?,
        None => (max_credits, None),
    };
    let created = accounts::create_api_key(
        connection,
        principal.team_id,
        &format!("agent run {run_id}"),
        principal.role,
        principal.user_id(),
        expires_at,
    )
    .await?;
    let lineage = parent
        .as_ref()
        .map(keys::Parent::child_lineage)
        .unwrap_or_default();
    sqlx::query("UPDATE api_keys SET max_credits = $2, lineage = $3 WHERE id = $1")
        .bind(created.key.id)
        .bind(max_credits)
        .bind(&lineage)
        .execute(&mut *connection)
        .await?;
    let (nonce, sealed) = sandbase_vault::seal_value(
        connection,
        keyring,
        principal.team_id,
        &label(run_id),
        created.token.as_bytes(),
    )
    .await
    .map_err(vault_error)?;
    Ok(Sealed {
        key_id: created.key.id,
        nonce,
        sealed,
    })
}

/// The run's token, opened.
pub async fn open(
    connection: &mut PgConnection,
    keyring: &sandbase_vault::Keyring,
    team_id: Uuid,
    run_id: Uuid,
    nonce: &[u8],
    sealed: &[u8],
) -> Result<String, sandbase_vault::VaultError> {
    let opened =
        sandbase_vault::open_value(connection, keyring, team_id, &label(run_id), nonce, sealed)
            .await?;
    String::from_utf8(opened.to_vec()).map_err(|_| sandbase_vault::VaultError::Decrypt)
}

/// The head of every call the run makes: its key, opened (none: the vault could not open it).
pub async fn head(
    state: &crate::state::AppState,
    row: &super::rows::AgentRunRow,
) -> Option<http::request::Parts> {
    let keyring = state.vault.as_deref()?;
    let mut connection = state.db.acquire().await.ok()?;
    let (nonce, sealed) = (&row.key_nonce, &row.key_sealed);
    let token = open(&mut connection, keyring, row.team_id, row.id, nonce, sealed)
        .await
        .ok()?;
    let value = http::HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    let mut parts = http::Request::new(()).into_parts().0;
    parts.headers.insert(http::header::AUTHORIZATION, value);
    Some(parts)
}
