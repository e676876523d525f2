//! Sandboxes' store credentials. A sandbox created with store access gets one (`sbs_…`,
//! kept hashed with its row); the gateway hands it to the sandbox's worker, whose egress
//! proxy adds it to the sandbox's requests to the store host — the sandbox never holds it.
//! A store call with it is the sandbox's: its team, the key (or member) that created it,
//! and its spend cap as well as the key's. It stops working when the sandbox stops, or when
//! its key is revoked or its creator leaves the team.

use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::Principal;
use super::authenticate::{key_principal, key_record, member_principal};
use crate::error::ApiError;
use crate::state::AppState;

/// What every store credential starts with.
pub const PREFIX: &str = "sbs_";

/// A freshly made store credential (wiped when dropped).
pub struct StoreToken(pub String);

impl StoreToken {
    pub fn generate() -> StoreToken {
        use base64::Engine;
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        StoreToken(format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
        ))
    }

    pub fn hash(&self) -> Vec<u8> {
        hash(&self.0)
    }
}

impl Drop for StoreToken {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// The caller a store credential makes, and its sandbox: 401 `invalid_api_key` unless the
/// sandbox is live; the creating key's revocation or expiry, or the creator's departure,
/// end it too.
pub async fn authenticate(state: &AppState, token: &str) -> Result<(Principal, Uuid), ApiError> {
    let row: Option<(Uuid, Uuid, Option<String>, Option<Uuid>)> = sqlx::query_as(
        "SELECT s.id, s.team_id, k.public_id, s.user_id FROM sandboxes s \
         LEFT JOIN api_keys k ON k.id = s.api_key_id \
         WHERE s.store_token_hash = $1 AND s.state IN ('creating', 'running', 'paused')",
    )
    .bind(hash(token))
    .fetch_optional(&state.db)
    .await?;
    let (sandbox, team_id, public_id, user_id) =
        row.ok_or(ApiError::InvalidApiKey { team_id: None })?;
    let principal = match (public_id, user_id) {
        (Some(public_id), _) => {
            let record = key_record(state, &public_id, false)
                .await?
                .ok_or(ApiError::InvalidApiKey { team_id: None })?;
            key_principal(record, state)?
        }
        (None, Some(user_id)) => {
            member_principal(state, team_id, user_id)
                .await?
                .ok_or(ApiError::InvalidApiKey {
                    team_id: Some(team_id),
                })?
        }
        (None, None) => return Err(ApiError::InvalidApiKey { team_id: None }),
    };
    Ok((principal, sandbox))
}
