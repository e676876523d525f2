//! Moving files between here and a sandbox: `cp` either way, archives packed and unpacked
//! (with progress on a terminal), and the byte counts people read.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use futures_util::StreamExt;
use reqwest::Method;
use uuid::Uuid;

use crate::client::Client;

/// `ID:/path` → (id, path); anything else is local.
fn remote(spec: &str) -> Option<(Uuid, &str)> {
    let (id, path) = spec.split_once(':')?;
    Some((id.parse().ok()?, path))
}

pub async fn copy(client: &Client, source: &str, destination: &str) -> anyhow::Result<()> {
    match (remote(source), remote(destination)) {
        (Some(_), Some(_)) => bail!("copy between two sandboxes through a local directory"),
        (None, None) => bail!("one side must be a sandbox path: ID:/path"),
        (Some((id, path)), None) => {
            let response = client
                .stream(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/files"),
                    &[("path", path.to_owned())],
                    None,
                    None,
                )
                .await?;
            let is_listing = response
                .headers()
                .get("content-type")
                .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
            let local = Path::new(destination);
            if is_listing {
                // A directory: fetch it as an archive.
                let name = Path::new(path)
                    .file_name()
                    .map(PathBuf::from)
                    .unwrap_or_default();
                let target = if local.is_dir() {
                    local.join(name)
                } else {
                    local.to_path_buf()
                };
                std::fs::create_dir_all(&target)?;
                let count = download_archive(client, id, path, &target).await?;
                eprintln!(
                    "copied {path} ({}) to {}",
                    human_bytes(count.bytes),
                    target.display()
                );
                return Ok(());
            }
            let target = if local.is_dir() {
                local.join(
                    Path::new(path)
                        .file_name()
                        .context("the source has no file name")?,
                )
            } else {
                local.to_path_buf()
            };
            let mut file = std::fs::File::create(&target)
                .with_context(|| format!("creating {}", target.display()))?;
            let mut progress = Progress::new("downloading");
            let mut stream = response.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.context("reading the file")?;
                file.write_all(&chunk)?;
                progress.add(chunk.len() as u64);
            }
            progress.finish();
        }
        (None, Some((id, path))) => {
            let local = Path::new(source);
            let metadata = std::fs::metadata(local).with_context(|| format!("reading {source}"))?;
            if metadata.is_dir() {
                let archive = pack(local)?;
                let size = archive.len() as u64;
                client
                    .stream(
                        Method::PUT,
                        &format!("/v1/sandboxes/{id}/archive"),
                        &[("path", path.to_owned())],
                        Some(archive.into()),
                        None,
                    )
                    .await?;
                eprintln!("copied {source} ({}) to {id}:{path}", human_bytes(size));
            } else {
                let content = std::fs::read(local)?;
                let size = content.len() as u64;
                client
                    .stream(
                        Method::PUT,
                        &format!("/v1/sandboxes/{id}/files"),
                        &[("path", path.to_owned())],
                        Some(content.into()),
                        None,
                    )
                    .await?;
                eprintln!("copied {source} ({}) to {id}:{path}", human_bytes(size));
            }
        }
    }
    Ok(())
}

/// A local directory as a tar archive.
pub(crate) fn pack(directory: &Path) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder
        .append_dir_all(".", directory)
        .with_context(|| format!("archiving {}", directory.display()))?;
    Ok(builder.into_inner()?)
}

/// Downloads `path` of a sandbox as an archive and unpacks it into `target`; returns the
/// archive's size.
pub async fn download_archive(
    client: &Client,
    id: Uuid,
    path: &str,
    target: &Path,
) -> anyhow::Result<Unpacked> {
    let response = client
        .stream(
            Method::GET,
            &format!("/v1/sandboxes/{id}/archive"),
            &[("path", path.to_owned())],
            None,
            None,
        )
        .await?;
    unpack_response(response, target).await
}

/// Reads an archive answer (with progress) and unpacks it into `target`.
/// What an archive held: its size and its files.
pub struct Unpacked {
    pub bytes: u64,
    pub files: usize,
}

pub async fn unpack_response(
    response: reqwest::Response,
    target: &Path,
) -> anyhow::Result<Unpacked> {
    let mut archive = Vec::new();
    let mut progress = Progress::new("downloading");
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("reading the archive")?;
        archive.extend_from_slice(&chunk);
        progress.add(chunk.len() as u64);
    }
    progress.finish();
    std::fs::create_dir_all(target)?;
    let files = tar::Archive::new(archive.as_slice())
        .entries()
        .context("reading the archive")?
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|entry| entry.header().entry_type().is_file())
        })
        .count();
    let mut unpacker = tar::Archive::new(archive.as_slice());
    unpacker.set_preserve_permissions(true);
    unpacker
        .unpack(target)
        .with_context(|| format!("unpacking into {}", target.display()))?;
    Ok(Unpacked {
        bytes: archive.len() as u64,
        files,
    })
}

/// A byte counter on standard error, redrawn in place when it is a terminal.
pub struct Progress {
    label: &'static str,
    bytes: u64,
    shown: bool,
}

impl Progress {
    pub fn new(label: &'static str) -> Progress {
        Progress {
            label,
            bytes: 0,
            shown: std::io::stderr().is_terminal(),
        }
    }

    pub fn add(&mut self, bytes: u64) {
        self.bytes += bytes;
        if self.shown {
            eprint!("\r{} {}   ", self.label, human_bytes(self.bytes));
        }
    }

    pub fn finish(&self) {
        if self.shown {
            eprintln!();
        }
    }
}

pub fn human_bytes(bytes: u64) -> String {
    const UNITS: &[&str] = &["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
