//! The vault's tables: `vault_data_keys` (a team's data key, wrapped) and `secret_versions`
//! (a secret's values, encrypted). Secret metadata (name, hosts, injection) is the
//! gateway's.

use aes_gcm::aead::OsRng;
use aes_gcm::aead::rand_core::RngCore;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;
use zeroize::Zeroizing;

use crate::keyring::{KEY_BYTES, Keyring};
use crate::{VaultError, open, seal};

/// A team's data key, in the clear (cleared on drop).
pub struct DataKey {
    pub team_id: Uuid,
    key: Zeroizing<[u8; KEY_BYTES]>,
}

fn data_key_aad(team_id: Uuid) -> Vec<u8> {
    format!("sandbase/data-key/v1|{team_id}").into_bytes()
}

fn secret_aad(team_id: Uuid, secret_id: Uuid, version: i32) -> Vec<u8> {
    format!("sandbase/secret/v1|{team_id}|{secret_id}|{version}").into_bytes()
}

fn unwrap_key(
    keyring: &Keyring,
    team_id: Uuid,
    kek_version: i32,
    nonce: &[u8],
    wrapped: &[u8],
) -> Result<Zeroizing<[u8; KEY_BYTES]>, VaultError> {
    let opened = open(
        keyring.key(kek_version)?,
        &data_key_aad(team_id),
        nonce,
        wrapped,
    )?;
    let key: [u8; KEY_BYTES] = opened
        .as_slice()
        .try_into()
        .map_err(|_| VaultError::Decrypt)?;
    Ok(Zeroizing::new(key))
}

/// The team's data key, created (random, wrapped by the current KEK) on first use.
pub async fn data_key(
    connection: &mut PgConnection,
    keyring: &Keyring,
    team_id: Uuid,
) -> Result<DataKey, VaultError> {
    for _ in 0..2 {
        let row: Option<(i32, Vec<u8>, Vec<u8>)> = sqlx::query_as(
            "SELECT kek_version, nonce, wrapped FROM vault_data_keys WHERE team_id = $1",
        )
        .bind(team_id)
        .fetch_optional(&mut *connection)
        .await?;
        if let Some((kek_version, nonce, wrapped)) = row {
            return Ok(DataKey {
                team_id,
                key: unwrap_key(keyring, team_id, kek_version, &nonce, &wrapped)?,
            });
        }
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        OsRng.fill_bytes(key.as_mut_slice());
        let current = keyring.current();
        let (nonce, wrapped) = seal(
            keyring.key(current)?,
            &data_key_aad(team_id),
            key.as_slice(),
        );
        // Another gateway may create it at the same time: the first one wins, both use it.
        sqlx::query(
            "INSERT INTO vault_data_keys (team_id, kek_version, nonce, wrapped) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (team_id) DO NOTHING",
        )
        .bind(team_id)
        .bind(current)
        .bind(nonce)
        .bind(wrapped)
        .execute(&mut *connection)
        .await?;
    }
    Err(VaultError::NotFound)
}

/// Encrypts `value` as version `version` of secret `secret_id` of the team.
pub async fn seal_secret(
    connection: &mut PgConnection,
    keyring: &Keyring,
    team_id: Uuid,
    secret_id: Uuid,
    version: i32,
    value: &[u8],
) -> Result<(), VaultError> {
    let data_key = data_key(connection, keyring, team_id).await?;
    let (nonce, ciphertext) = seal(
        &data_key.key,
        &secret_aad(team_id, secret_id, version),
        value,
    );
    sqlx::query(
        "INSERT INTO secret_versions (secret_id, version, team_id, nonce, ciphertext) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(secret_id)
    .bind(version)
    .bind(team_id)
    .bind(nonce)
    .bind(ciphertext)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// Decrypts version `version` of secret `secret_id`, which belongs to `team_id`.
pub async fn reveal(
    connection: &mut PgConnection,
    keyring: &Keyring,
    team_id: Uuid,
    secret_id: Uuid,
    version: i32,
) -> Result<Zeroizing<Vec<u8>>, VaultError> {
    let row: Option<(Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT nonce, ciphertext FROM secret_versions WHERE secret_id = $1 AND version = $2",
    )
    .bind(secret_id)
    .bind(version)
    .fetch_optional(&mut *connection)
    .await?;
    let (nonce, ciphertext) = row.ok_or(VaultError::NotFound)?;
    let data_key = data_key(connection, keyring, team_id).await?;
    open(
        &data_key.key,
        &secret_aad(team_id, secret_id, version),
        &nonce,
        &ciphertext,
    )
}

/// Re-wraps every data key not under the current KEK, a few at a time (each in its own
/// transaction, rows locked only while re-wrapped): gateways holding both keys keep working
/// throughout. Returns how many were re-wrapped.
pub async fn rotate(db: &PgPool, keyring: &Keyring) -> Result<usize, VaultError> {
    let current = keyring.current();
    let mut rewrapped = 0;
    loop {
        let mut transaction = db.begin().await?;
        let rows: Vec<(Uuid, i32, Vec<u8>, Vec<u8>)> = sqlx::query_as(
            "SELECT team_id, kek_version, nonce, wrapped FROM vault_data_keys \
             WHERE kek_version <> $1 LIMIT 100 FOR UPDATE SKIP LOCKED",
        )
        .bind(current)
        .fetch_all(&mut *transaction)
        .await?;
        if rows.is_empty() {
            transaction.commit().await?;
            return Ok(rewrapped);
        }
        for (team_id, kek_version, nonce, wrapped) in rows {
            let key = unwrap_key(keyring, team_id, kek_version, &nonce, &wrapped)?;
            let (nonce, wrapped) = seal(
                keyring.key(current)?,
                &data_key_aad(team_id),
                key.as_slice(),
            );
            sqlx::query(
                "UPDATE vault_data_keys SET kek_version = $2, nonce = $3, wrapped = $4, rotated_at = now() \
                 WHERE team_id = $1",
            )
            .bind(team_id)
            .bind(current)
            .bind(nonce)
            .bind(wrapped)
            .execute(&mut *transaction)
            .await?;
            rewrapped += 1;
        }
        transaction.commit().await?;
    }
}
