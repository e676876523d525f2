//! An upstream's operator credential: read when the gateway starts from the environment
//! variable, file or operator secret its configuration names, and — for a file (a mounted
//! Kubernetes Secret) or an operator secret (`sandbase vault secret set`) — read again while
//! the gateway runs (`store.credentials_refresh_secs`), so a rotation reaches every gateway
//! without a restart. A source that cannot be read keeps the value it had; the value is
//! never logged.

use std::path::PathBuf;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use secrecy::{ExposeSecret, SecretString};

use crate::config::CredentialSource;

/// The operator secrets the store's upstreams name, by name, revealed from the vault.
pub type OperatorSecrets = std::collections::HashMap<String, SecretString>;

/// Where a credential comes from.
enum Source {
    /// None, or an environment variable (read once: a process's environment does not change).
    Fixed,
    File(PathBuf),
    Secret(String),
}

/// One upstream's credential, swapped in place when its source changes.
pub struct Credential {
    /// The configuration key of its upstream (`store.providers[0]`), for errors and logs.
    key: String,
    source: Source,
    value: RwLock<Option<SecretString>>,
    /// Bumped at each change (holders of something built from the value rebuild it).
    version: AtomicU64,
}

impl Credential {
    /// The credential the upstream at `key` names, read now (revealed secrets in `secrets`).
    pub fn load(
        key: &str,
        source: CredentialSource<'_>,
        secrets: &OperatorSecrets,
    ) -> anyhow::Result<Credential> {
        let (source, value) = if let Some(variable) = source.env {
            let value = std::env::var(variable).map_err(|_| {
                anyhow::anyhow!(
                    "key `{key}.credential_env`: the environment variable {variable} is not set"
                )
            })?;
            (Source::Fixed, Some(SecretString::from(value)))
        } else if let Some(path) = source.file {
            let value = read_file(path).with_context(|| {
                format!("key `{key}.credential_file`: reading {}", path.display())
            })?;
            (Source::File(path.to_owned()), Some(value))
        } else if let Some(name) = source.secret {
            let value = secrets.get(name).with_context(|| {
                format!("key `{key}.credential_secret`: no operator secret named `{name}`")
            })?;
            (Source::Secret(name.to_owned()), Some(value.clone()))
        } else {
            (Source::Fixed, None)
        };
        Ok(Credential {
            key: key.to_owned(),
            source,
            value: RwLock::new(value),
            version: AtomicU64::new(0),
        })
    }

    /// The value now, if the upstream has one.
    pub fn get(&self) -> Option<SecretString> {
        self.value
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether it can change while the gateway runs.
    pub fn refreshable(&self) -> bool {
        !matches!(self.source, Source::Fixed)
    }

    /// Reads its source again; swaps the value in when it changed. A source that cannot be
    /// read leaves the value as it was (and says so).
    pub async fn refresh(&self, db: &sqlx::PgPool, keyring: Option<&sandbase_vault::Keyring>) {
        let fresh = match &self.source {
            Source::Fixed => return,
            Source::File(path) => match read_file(path) {
                Ok(value) if value.expose_secret().is_empty() => {
                    Err("the file is empty".to_owned())
                }
                Ok(value) => Ok(value),
                Err(error) => Err(format!("{error:#}")),
            },
            Source::Secret(name) => reveal(db, keyring, name).await,
        };
        let fresh = match fresh {
            Ok(fresh) => fresh,
            Err(why) => {
                tracing::warn!(upstream = %self.key, why, "a store credential could not be read again: the one read before is kept");
                return;
            }
        };
        let mut value = self
            .value
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let changed = value
            .as_ref()
            .is_none_or(|old| old.expose_secret() != fresh.expose_secret());
        if changed {
            *value = Some(fresh);
            self.version.fetch_add(1, Ordering::AcqRel);
            tracing::info!(upstream = %self.key, "a store credential changed: calls now use the new one");
        }
    }
}

fn read_file(path: &std::path::Path) -> anyhow::Result<SecretString> {
    let value = std::fs::read_to_string(path)?;
    Ok(SecretString::from(value.trim().to_owned()))
}

async fn reveal(
    db: &sqlx::PgPool,
    keyring: Option<&sandbase_vault::Keyring>,
    name: &str,
) -> Result<SecretString, String> {
    let keyring = keyring.ok_or("the vault is not configured")?;
    let mut connection = db.acquire().await.map_err(|error| error.to_string())?;
    let value = sandbase_vault::reveal_operator_secret(&mut connection, keyring, name)
        .await
        .map_err(|error| format!("the vault: {error}"))?
        .ok_or_else(|| format!("no operator secret named `{name}`"))?;
    let value = String::from_utf8(value.to_vec())
        .map_err(|_| format!("operator secret `{name}` is not UTF-8"))?;
    Ok(SecretString::from(value))
}
