//! Password hashing with Argon2id, always off the async runtime and a bounded number at once.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use secrecy::{ExposeSecret, SecretString};
use std::time::Duration;
use tokio::sync::Semaphore;

use crate::error::ApiError;

pub const MIN_LENGTH: usize = 10;
pub const MAX_LENGTH: usize = 256;

/// Argon2id hashing and verification, off the async runtime and at most `slots` at once
/// (each takes 19 MiB and a core for tens of milliseconds): a flood of logins waits briefly
/// for a slot and is then answered 503 `busy`, instead of eating the machine's memory.
pub struct Passwords {
    slots: Semaphore,
    wait: Duration,
}

impl Passwords {
    /// `slots` hashes at once (0: one per core); a caller waits at most `wait` for one.
    pub fn new(slots: usize, wait: Duration) -> Passwords {
        let slots = if slots == 0 {
            std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
        } else {
            slots
        };
        Passwords {
            slots: Semaphore::new(slots),
            wait,
        }
    }

    async fn slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
        match tokio::time::timeout(self.wait, self.slots.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => {
                metrics::counter!("sandbase_password_busy_total").increment(1);
                Err(ApiError::Busy)
            }
        }
    }

    /// Hashes `password` with a fresh salt (Argon2id, the crate's recommended parameters).
    pub async fn hash(&self, password: SecretString) -> Result<String, ApiError> {
        let _slot = self.slot().await?;
        tokio::task::spawn_blocking(move || {
            let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
            Argon2::default()
                .hash_password(password.expose_secret().as_bytes(), &salt)
                .map(|hash| hash.to_string())
                .map_err(|error| anyhow::anyhow!("hashing a password: {error}"))
        })
        .await
        .map_err(|error| anyhow::anyhow!("password hashing task failed: {error}"))?
        .map_err(ApiError::from)
    }

    /// Checks `password` against a stored hash. With no stored hash (unknown e-mail) it
    /// still spends the time of one verification, so response times do not reveal which
    /// e-mails exist.
    pub async fn verify(
        &self,
        password: SecretString,
        stored_hash: Option<String>,
    ) -> Result<bool, ApiError> {
        let _slot = self.slot().await?;
        tokio::task::spawn_blocking(move || {
            let stored = stored_hash.unwrap_or_else(|| DUMMY_HASH.to_owned());
            let parsed = PasswordHash::new(&stored)
                .map_err(|error| anyhow::anyhow!("stored password hash is malformed: {error}"))?;
            let matches = Argon2::default()
                .verify_password(password.expose_secret().as_bytes(), &parsed)
                .is_ok();
            Ok::<bool, anyhow::Error>(matches && stored != DUMMY_HASH)
        })
        .await
        .map_err(|error| anyhow::anyhow!("password verification task failed: {error}"))?
        .map_err(ApiError::from)
    }
}

/// Validates a new password's length (in characters).
pub fn check_new(password: &str) -> Result<(), ApiError> {
    let length = password.chars().count();
    if length < MIN_LENGTH {
        return Err(ApiError::InvalidRequest(format!(
            "password must be at least {MIN_LENGTH} characters long"
        )));
    }
    if length > MAX_LENGTH {
        return Err(ApiError::InvalidRequest(format!(
            "password must be at most {MAX_LENGTH} characters long"
        )));
    }
    Ok(())
}

/// The Argon2id hash of a random string nobody knows, with the default parameters.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c2FuZGJhc2VkdW1teXNhbHQ$0pvQhWn7S4n1o1lRkX8cKqKsb3m2A9pU2b4pNfJw3yE";
