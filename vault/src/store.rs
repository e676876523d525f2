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

/// Encrypts `value` as version `version` of secret `secret_id` of the team, and destroys
/// every older version: a rotated credential leaves no ciphertext of its old value behind.
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
    sqlx::query("DELETE FROM secret_versions WHERE secret_id = $1 AND version < $2")
        .bind(secret_id)
        .bind(version)
        .execute(&mut *connection)
        .await?;
    Ok(())
}

/// Encrypts `value` with the team's data key, bound to `label` (what it is, say
/// `agent-run-key/<run id>`): its nonce and ciphertext, kept by the caller. Only
/// [`open_value`] with the same team and label opens it.
pub async fn seal_value(
    connection: &mut PgConnection,
    keyring: &Keyring,
    team_id: Uuid,
    label: &str,
    value: &[u8],
) -> Result<(Vec<u8>, Vec<u8>), VaultError> {
    let data_key = data_key(connection, keyring, team_id).await?;
    Ok(seal(&data_key.key, &value_aad(team_id, label), value))
}

/// Decrypts what [`seal_value`] sealed for `team_id` under `label`.
pub async fn open_value(
    connection: &mut PgConnection,
    keyring: &Keyring,
    team_id: Uuid,
    label: &str,
    nonce: &[u8],
    ciphertext: &[u8],
) -> Result<Zeroizing<Vec<u8>>, VaultError> {
    let data_key = data_key(connection, keyring, team_id).await?;
    open(&data_key.key, &value_aad(team_id, label), nonce, ciphertext)
}

fn value_aad(team_id: Uuid, label: &str) -> Vec<u8> {
    format!("sandbase/value/v1|{team_id}|{label}").into_bytes()
}

/// Decrypts version `version` of secret `secret_id`, which belongs to `team_id`.
pub async fn reveal(
    connection: &mut PgConnection,
    keyring: &Keyring,
    team_id: Uuid,
    secret_id: Uuid,
    version: i32,
) -> Result<Zeroizing<Vec<u8>>, VaultError> {
    // The value and the data key in one snapshot, so a concurrent data-key rotation (which
    // changes both in one transaction) is seen entirely or not at all.
    let row: Option<Sealed> = sqlx::query_as(
        "SELECT v.nonce, v.ciphertext, k.kek_version, k.nonce AS key_nonce, k.wrapped \
         FROM secret_versions v JOIN vault_data_keys k ON k.team_id = v.team_id \
         WHERE v.secret_id = $1 AND v.version = $2 AND v.team_id = $3",
    )
    .bind(secret_id)
    .bind(version)
    .bind(team_id)
    .fetch_optional(&mut *connection)
    .await?;
    let sealed = row.ok_or(VaultError::NotFound)?;
    let key = unwrap_key(
        keyring,
        team_id,
        sealed.kek_version,
        &sealed.key_nonce,
        &sealed.wrapped,
    )?;
    open(
        &key,
        &secret_aad(team_id, secret_id, version),
        &sealed.nonce,
        &sealed.ciphertext,
    )
}

/// The teams that have a data key (every team that ever stored a secret).
pub async fn teams_with_data_keys(db: &PgPool) -> Result<Vec<Uuid>, VaultError> {
    Ok(
        sqlx::query_scalar("SELECT team_id FROM vault_data_keys ORDER BY team_id")
            .fetch_all(db)
            .await?,
    )
}

/// A value as stored, with its team's wrapped data key.
#[derive(sqlx::FromRow)]
struct Sealed {
    nonce: Vec<u8>,
    ciphertext: Vec<u8>,
    kek_version: i32,
    key_nonce: Vec<u8>,
    wrapped: Vec<u8>,
}

/// Replaces the team's data key with a new random one and re-encrypts every stored value
/// under it, in one transaction (the old key is gone afterwards: whoever copied it, or a
/// value's ciphertext, from an old backup has nothing that opens the current values).
/// Returns how many values were re-encrypted.
pub async fn rotate_data_key(
    db: &PgPool,
    keyring: &Keyring,
    team_id: Uuid,
) -> Result<usize, VaultError> {
    let mut transaction = db.begin().await?;
    let row: Option<(i32, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT kek_version, nonce, wrapped FROM vault_data_keys WHERE team_id = $1 FOR UPDATE",
    )
    .bind(team_id)
    .fetch_optional(&mut *transaction)
    .await?;
    let Some((kek_version, nonce, wrapped)) = row else {
        // No data key yet: nothing was ever encrypted for this team.
        transaction.commit().await?;
        return Ok(0);
    };
    let old = unwrap_key(keyring, team_id, kek_version, &nonce, &wrapped)?;
    let mut new = Zeroizing::new([0u8; KEY_BYTES]);
    OsRng.fill_bytes(new.as_mut_slice());
    let values: Vec<(Uuid, i32, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT secret_id, version, nonce, ciphertext FROM secret_versions \
         WHERE team_id = $1 FOR UPDATE",
    )
    .bind(team_id)
    .fetch_all(&mut *transaction)
    .await?;
    for (secret_id, version, nonce, ciphertext) in &values {
        let aad = secret_aad(team_id, *secret_id, *version);
        let value = open(&old, &aad, nonce, ciphertext)?;
        let (nonce, ciphertext) = seal(&new, &aad, &value);
        sqlx::query(
            "UPDATE secret_versions SET nonce = $3, ciphertext = $4 \
             WHERE secret_id = $1 AND version = $2",
        )
        .bind(secret_id)
        .bind(version)
        .bind(nonce)
        .bind(ciphertext)
        .execute(&mut *transaction)
        .await?;
    }
    store_wrapped(&mut transaction, keyring, team_id, &new).await?;
    transaction.commit().await?;
    Ok(values.len())
}

/// Writes the team's data key `key`, wrapped under the current KEK.
async fn store_wrapped(
    connection: &mut PgConnection,
    keyring: &Keyring,
    team_id: Uuid,
    key: &[u8; KEY_BYTES],
) -> Result<(), VaultError> {
    let current = keyring.current();
    let (nonce, wrapped) = seal(keyring.key(current)?, &data_key_aad(team_id), key);
    sqlx::query(
        "UPDATE vault_data_keys SET kek_version = $2, nonce = $3, wrapped = $4, rotated_at = now() \
         WHERE team_id = $1",
    )
    .bind(team_id)
    .bind(current)
    .bind(nonce)
    .bind(wrapped)
    .execute(connection)
    .await?;
    Ok(())
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
            store_wrapped(&mut transaction, keyring, team_id, &key).await?;
            rewrapped += 1;
        }
        transaction.commit().await?;
    }
}
