//! The operator's vault: the deployment's own credentials (an upstream provider's key, a
//! paid API's token), named, sealed by the current key-encryption key and bound to their
//! name, so a ciphertext copied onto another name does not open. No team can read them: the
//! gateway reveals them at start-up for the store's upstream calls only.

use sqlx::{PgConnection, PgPool};
use zeroize::Zeroizing;

use crate::keyring::Keyring;
use crate::{VaultError, open, seal};

fn aad(name: &str) -> Vec<u8> {
    format!("sandbase/operator-secret/v1|{name}").into_bytes()
}

/// An operator secret's name and when it was last set.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OperatorSecret {
    pub name: String,
    pub kek_version: i32,
    /// RFC 3339, UTC.
    pub updated_at: String,
}

/// Stores `value` under `name`, replacing any earlier value (the old ciphertext is
/// overwritten in place). Returns true when the name was new.
pub async fn set_operator_secret(
    connection: &mut PgConnection,
    keyring: &Keyring,
    name: &str,
    value: &[u8],
) -> Result<bool, VaultError> {
    let current = keyring.current();
    let (nonce, ciphertext) = seal(keyring.key(current)?, &aad(name), value);
    let inserted: bool = sqlx::query_scalar(
        "INSERT INTO operator_secrets (name, kek_version, nonce, ciphertext) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (name) DO UPDATE SET kek_version = $2, nonce = $3, ciphertext = $4, \
         updated_at = now() RETURNING (xmax = 0)",
    )
    .bind(name)
    .bind(current)
    .bind(nonce)
    .bind(ciphertext)
    .fetch_one(connection)
    .await?;
    Ok(inserted)
}

/// The value of operator secret `name`, or `None` when there is none.
pub async fn reveal_operator_secret(
    connection: &mut PgConnection,
    keyring: &Keyring,
    name: &str,
) -> Result<Option<Zeroizing<Vec<u8>>>, VaultError> {
    let row: Option<(i32, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT kek_version, nonce, ciphertext FROM operator_secrets WHERE name = $1",
    )
    .bind(name)
    .fetch_optional(connection)
    .await?;
    row.map(|(version, nonce, ciphertext)| {
        open(keyring.key(version)?, &aad(name), &nonce, &ciphertext)
    })
    .transpose()
}

/// The operator secrets' names and key versions, by name (never a value).
pub async fn operator_secrets(db: &PgPool) -> Result<Vec<OperatorSecret>, VaultError> {
    Ok(sqlx::query_as(
        "SELECT name, kek_version, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS updated_at \
         FROM operator_secrets ORDER BY name",
    )
    .fetch_all(db)
    .await?)
}

/// Deletes operator secret `name`; true when there was one.
pub async fn remove_operator_secret(db: &PgPool, name: &str) -> Result<bool, VaultError> {
    let deleted = sqlx::query("DELETE FROM operator_secrets WHERE name = $1")
        .bind(name)
        .execute(db)
        .await?;
    Ok(deleted.rows_affected() == 1)
}

/// Re-seals every operator secret not under the current KEK (part of a KEK rotation).
/// Returns how many were re-sealed.
pub async fn reseal_operator_secrets(db: &PgPool, keyring: &Keyring) -> Result<usize, VaultError> {
    let current = keyring.current();
    let mut transaction = db.begin().await?;
    let rows: Vec<(String, i32, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT name, kek_version, nonce, ciphertext FROM operator_secrets \
         WHERE kek_version <> $1 FOR UPDATE",
    )
    .bind(current)
    .fetch_all(&mut *transaction)
    .await?;
    for (name, version, nonce, ciphertext) in &rows {
        let value = open(keyring.key(*version)?, &aad(name), nonce, ciphertext)?;
        let (nonce, ciphertext) = seal(keyring.key(current)?, &aad(name), &value);
        sqlx::query(
            "UPDATE operator_secrets SET kek_version = $2, nonce = $3, ciphertext = $4 \
             WHERE name = $1",
        )
        .bind(name)
        .bind(current)
        .bind(nonce)
        .bind(ciphertext)
        .execute(&mut *transaction)
        .await?;
    }
    transaction.commit().await?;
    Ok(rows.len())
}
