//! The CLI's saved credentials: `$XDG_CONFIG_HOME/sandbase/credentials.json`
//! (or `~/.config/sandbase/credentials.json`), readable by its owner only.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Saved {
    pub url: String,
    pub api_key: String,
}

pub fn path() -> PathBuf {
    let config_dir = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::home_dir().join(".config"));
    config_dir.join("sandbase").join("credentials.json")
}

pub fn load() -> anyhow::Result<Option<Saved>> {
    let path = path();
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(
            serde_json::from_slice(&bytes)
                .with_context(|| format!("reading {}", path.display()))?,
        )),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
    }
}

pub fn save(url: &str, api_key: &str) -> anyhow::Result<PathBuf> {
    let path = path();
    let saved = Saved {
        url: url.to_owned(),
        api_key: api_key.to_owned(),
    };
    write_private(&path, &serde_json::to_vec_pretty(&saved)?)?;
    Ok(path)
}

/// Saves only when nothing is saved yet; returns whether it saved.
pub fn save_if_absent(url: &str, api_key: &str) -> anyhow::Result<bool> {
    if path().exists() {
        return Ok(false);
    }
    save(url, api_key)?;
    Ok(true)
}

/// Writes `contents` to `path` with mode 0600, atomically (temporary file, then rename).
pub fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .context("credentials path has no parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .with_context(|| format!("writing {}", temporary.display()))?;
    file.write_all(contents)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
