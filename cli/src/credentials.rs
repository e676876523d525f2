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
        .unwrap_or_else(|| crate::args::home_dir().join(".config"));
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

/// Writes `contents` to `path` with mode 0600, atomically: a new temporary file of a random
/// name, created exclusively (never an existing file, never through a link someone left in
/// the directory), then renamed over `path`.
pub fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .context("credentials path has no parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path
        .file_name()
        .context("credentials path has no file name")?
        .to_string_lossy()
        .into_owned();
    let mut attempts = 0;
    let (temporary, mut file) = loop {
        let suffix: u64 = rand::random();
        let temporary = dir.join(format!(".{name}.{suffix:016x}.tmp"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)
        {
            Ok(file) => break (temporary, file),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists && attempts < 8 => {
                attempts += 1;
            }
            Err(error) => {
                return Err(error).with_context(|| format!("writing {}", temporary.display()));
            }
        }
    };
    let written = file
        .write_all(contents)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_stale_or_planted_temporary_file_neither_leaks_nor_redirects_the_secret() {
        let dir =
            std::env::temp_dir().join(format!("sandbase-credentials-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("credentials.json");
        // What an earlier writer left behind: a world-readable temporary file, and a link
        // from the old fixed temporary name to a file the attacker reads.
        let planted = dir.join("planted");
        std::fs::write(&planted, b"").unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&planted, path.with_extension("tmp")).unwrap();
        std::fs::write(dir.join(".credentials.json.tmp"), b"stale").unwrap();
        write_private(&path, b"sb_secret").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"sb_secret");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            std::fs::read(&planted).unwrap(),
            b"",
            "the secret went through the link"
        );
        // Writing again replaces the file and leaves no temporary file of its own.
        write_private(&path, b"sb_other").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"sb_other");
        let leftovers = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|entry| {
                let name = entry.as_ref().unwrap().file_name();
                let name = name.to_string_lossy();
                name.starts_with(".credentials.json.") && name.len() > ".credentials.json.tmp".len()
            })
            .count();
        assert_eq!(leftovers, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
