//! Operator volumes: host directories offered to sandboxes by name, read-only to every
//! team and writable only to the teams named, never over the places a sandbox needs.

use std::collections::BTreeMap;

use sandbase_api::internal::VolumeInfo;
use sandbase_api::sandboxes::Mount;
use uuid::Uuid;

use crate::error::NodeError;

/// A host directory the operator offers: read-only to every team, writable only to the
/// teams named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub path: std::path::PathBuf,
    /// Teams whose sandboxes may mount it writable (none: read-only for everyone).
    pub writers: Vec<Uuid>,
}

/// The volumes, as the gateway sees them.
pub fn infos(volumes: &BTreeMap<String, Volume>) -> Vec<VolumeInfo> {
    volumes
        .iter()
        .map(|(name, volume)| VolumeInfo {
            name: name.clone(),
            writable: !volume.writers.is_empty(),
            writers: volume.writers.clone(),
        })
        .collect()
}

/// Resolves requested mounts to host directories, refusing unknown volumes, writable
/// mounts of volumes this team may not write, and places the sandbox needs for itself.
pub fn resolve(
    volumes: &BTreeMap<String, Volume>,
    mounts: &[Mount],
    team: Option<Uuid>,
) -> Result<Vec<(String, String, bool)>, NodeError> {
    let mut resolved = Vec::new();
    for mount in mounts {
        let Some(volume) = volumes.get(&mount.volume) else {
            return Err(NodeError::Invalid(format!(
                "no volume `{}` on this worker",
                mount.volume
            )));
        };
        if !mount.read_only && !team.is_some_and(|team| volume.writers.contains(&team)) {
            return Err(NodeError::Invalid(format!(
                "volume `{}` is not writable by this team",
                mount.volume
            )));
        }
        if let Some(reason) = reserved_mount_path(&mount.path) {
            return Err(NodeError::Invalid(reason));
        }
        let host = volume
            .path
            .to_str()
            .ok_or_else(|| NodeError::Invalid("a volume path is not UTF-8".to_owned()))?;
        resolved.push((host.to_owned(), mount.path.clone(), mount.read_only));
    }
    Ok(resolved)
}

/// Why `path` cannot be a mount point, if it cannot: it must be absolute and normal, and
/// not cover what the sandbox itself needs.
pub fn reserved_mount_path(path: &str) -> Option<String> {
    let normal = path.starts_with('/')
        && path.len() > 1
        && !path.ends_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .skip(1)
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if !normal {
        return Some(format!(
            "mount path `{path}` must be an absolute, normal path"
        ));
    }
    // The sandbox's own places, and the system's.
    const RESERVED: &[&str] = &[
        "/proc",
        "/sys",
        "/dev",
        "/.sandbase",
        "/etc",
        "/bin",
        "/sbin",
        "/lib",
        "/lib64",
        "/usr",
    ];
    let under = |root: &str| path == root || path.starts_with(&format!("{root}/"));
    if path == "/work" || path == "/tmp" || RESERVED.iter().any(|root| under(root)) {
        return Some(format!("mount path `{path}` is reserved"));
    }
    None
}
