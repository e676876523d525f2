//! The vault: team credentials encrypted at rest.
//!
//! Envelope encryption. Each team has one random 256-bit data key, stored only wrapped
//! (AES-256-GCM) by a key-encryption key (KEK) from the operator's configuration; KEKs are
//! versioned so they can be rotated without downtime (`rotate` re-wraps data keys under the
//! newest while the older one still opens what was not re-wrapped yet), and a team's data key
//! itself can be replaced (`rotate_data_key` re-encrypts its values under a new one). A
//! secret keeps only its current version: storing a new value destroys the older ones. Each secret value is
//! AES-256-GCM under its team's data key with a fresh 96-bit nonce, and its associated data
//! names the team, the secret and the version: a ciphertext moved to another row (another
//! team's, another secret's, another version's) fails to decrypt instead of revealing
//! anything. Plaintext keys and values live in [`Zeroizing`] buffers, cleared on drop.
//!
//! The operator's own credentials (the store's upstream keys) are named operator secrets,
//! sealed by the KEK itself and bound to their name (`operator`).

mod keyring;
mod operator;
mod store;

pub use keyring::{KEY_BYTES, Keyring};
pub use operator::{
    OperatorSecret, operator_secrets, remove_operator_secret, reseal_operator_secrets,
    reveal_operator_secret, set_operator_secret,
};
pub use store::{
    DataKey, open_value, reveal, rotate, rotate_data_key, seal_secret, seal_value,
    teams_with_data_keys,
};
pub use zeroize::Zeroizing;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};

#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("invalid key-encryption key: {0}")]
    InvalidKey(String),
    #[error("no key-encryption key of version {0} is configured")]
    UnknownKeyVersion(i32),
    /// Wrong key, or ciphertext moved, truncated or altered. Says nothing more on purpose.
    #[error("a ciphertext failed to decrypt (wrong key, or moved or altered data)")]
    Decrypt,
    #[error("no such secret version")]
    NotFound,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// A fresh nonce and the ciphertext (with its tag) of `plaintext` under `key`, bound to `aad`.
pub(crate) fn seal(key: &[u8; KEY_BYTES], aad: &[u8], plaintext: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    #[allow(clippy::expect_used)] // encryption fails only for inputs beyond 64 GiB
    let ciphertext = cipher
        .encrypt(
            &nonce,
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .expect("AES-GCM encryption of a bounded input");
    (nonce.to_vec(), ciphertext)
}

pub(crate) fn open(
    key: &[u8; KEY_BYTES],
    aad: &[u8],
    nonce: &[u8],
    ciphertext: &[u8],
) -> Result<Zeroizing<Vec<u8>>, VaultError> {
    if nonce.len() != 12 {
        return Err(VaultError::Decrypt);
    }
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    cipher
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad,
            },
        )
        .map(Zeroizing::new)
        .map_err(|_| VaultError::Decrypt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_data_opens_only_with_its_key_and_associated_data() {
        let key = [7u8; KEY_BYTES];
        let (nonce, ciphertext) = seal(&key, b"team-a|secret-1|1", b"hunter2");
        assert!(!ciphertext.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(
            open(&key, b"team-a|secret-1|1", &nonce, &ciphertext)
                .unwrap()
                .as_slice(),
            b"hunter2"
        );
        assert!(open(&key, b"team-b|secret-1|1", &nonce, &ciphertext).is_err());
        assert!(open(&[8u8; KEY_BYTES], b"team-a|secret-1|1", &nonce, &ciphertext).is_err());
        let mut altered = ciphertext.clone();
        altered[0] ^= 1;
        assert!(open(&key, b"team-a|secret-1|1", &nonce, &altered).is_err());
        // Two seals of the same value differ (fresh nonces).
        let (other_nonce, other) = seal(&key, b"team-a|secret-1|1", b"hunter2");
        assert_ne!((nonce, ciphertext), (other_nonce, other));
    }
}
