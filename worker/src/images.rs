//! Root file systems from OCI images: an OCI image layout (as `docker save` or
//! `skopeo copy … oci-archive:` write them) or a Docker archive, layers applied in order with
//! their whiteouts. The result is then prepared like any template (agent mount points, the
//! sandbox user, owners shifted into the sandbox id range).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::Value;

/// The layers of the image in `unpacked` (an unpacked archive), bottom first.
pub fn layers(unpacked: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if unpacked.join("index.json").is_file() {
        let index: Value = read_json(&unpacked.join("index.json"))?;
        let mut manifest = blob(unpacked, index["manifests"][0]["digest"].as_str())?;
        // An index of manifests (multi-platform): take the linux/amd64 one, else the first.
        if manifest["manifests"].is_array() {
            let chosen = manifest["manifests"]
                .as_array()
                .and_then(|list| {
                    list.iter()
                        .find(|entry| {
                            entry["platform"]["os"] == "linux"
                                && entry["platform"]["architecture"] == "amd64"
                        })
                        .or_else(|| list.first())
                })
                .cloned()
                .context("an empty image index")?;
            manifest = blob(unpacked, chosen["digest"].as_str())?;
        }
        let layers = manifest["layers"]
            .as_array()
            .context("the image manifest has no layers")?;
        return layers
            .iter()
            .map(|layer| blob_path(unpacked, layer["digest"].as_str()))
            .collect();
    }
    if unpacked.join("manifest.json").is_file() {
        let manifest: Value = read_json(&unpacked.join("manifest.json"))?;
        let layers = manifest[0]["Layers"]
            .as_array()
            .context("manifest.json lists no layers")?;
        return layers
            .iter()
            .map(|layer| {
                let relative = layer.as_str().context("a layer path")?;
                safe_join(unpacked, relative)
            })
            .collect();
    }
    bail!("not an OCI image layout (index.json) or a Docker archive (manifest.json)")
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
}

fn blob(unpacked: &Path, digest: Option<&str>) -> anyhow::Result<Value> {
    read_json(&blob_path(unpacked, digest)?)
}

fn blob_path(unpacked: &Path, digest: Option<&str>) -> anyhow::Result<PathBuf> {
    let digest = digest.context("a descriptor without a digest")?;
    let (algorithm, hex) = digest
        .split_once(':')
        .with_context(|| format!("malformed digest {digest}"))?;
    anyhow::ensure!(
        !algorithm.is_empty()
            && hex.chars().all(|c| c.is_ascii_hexdigit())
            && algorithm.chars().all(|c| c.is_ascii_alphanumeric()),
        "malformed digest {digest}"
    );
    Ok(unpacked.join("blobs").join(algorithm).join(hex))
}

/// `base/relative`, refusing anything that would leave `base`.
fn safe_join(base: &Path, relative: &str) -> anyhow::Result<PathBuf> {
    anyhow::ensure!(
        !relative.starts_with('/') && !relative.split('/').any(|part| part == ".."),
        "a path leaving the archive: {relative}"
    );
    Ok(base.join(relative))
}

/// Opens a layer, gunzipping it when it is compressed.
fn open_layer(layer: &Path) -> anyhow::Result<Box<dyn std::io::Read>> {
    use std::io::Read;
    let mut file =
        std::fs::File::open(layer).with_context(|| format!("opening {}", layer.display()))?;
    let mut magic = [0u8; 4];
    let read = file.read(&mut magic)?;
    let file = std::fs::File::open(layer)?;
    Ok(match &magic[..read] {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(std::io::BufReader::new(file))),
        [0x28, 0xb5, 0x2f, 0xfd] => bail!("{}: zstd layers are not supported yet", layer.display()),
        _ => Box::new(std::io::BufReader::new(file)),
    })
}

/// Applies one layer (a tar, compressed or not) onto `rootfs`: whiteouts first (`.wh.NAME`
/// removes NAME, `.wh..wh..opq` empties its directory), then the layer's files. Nothing is
/// written or removed through a link: an image cannot reach the host's files.
pub fn apply_layer(rootfs: &Path, layer: &Path) -> anyhow::Result<()> {
    let mut whiteouts = Vec::new();
    let mut archive = tar::Archive::new(open_layer(layer)?);
    for entry in archive.entries()? {
        let entry = entry?;
        let path = entry.path()?.into_owned();
        if let Some(name) = path.file_name().and_then(|name| name.to_str())
            && let Some(hidden) = name.strip_prefix(".wh.")
        {
            let directory = path.parent().map(Path::to_path_buf).unwrap_or_default();
            whiteouts.push((directory, hidden.to_owned()));
        }
    }
    for (relative, hidden) in whiteouts {
        if hidden == ".wh..opq" {
            let directory = inside(rootfs, &relative)?;
            if std::fs::symlink_metadata(&directory).is_ok_and(|metadata| metadata.is_dir()) {
                for child in std::fs::read_dir(&directory)? {
                    remove(&child?.path())?;
                }
            }
        } else {
            remove(&inside(rootfs, &relative.join(&hidden))?)?;
        }
    }
    let mut archive = tar::Archive::new(open_layer(layer)?);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with(".wh."))
        {
            continue;
        }
        // `unpack_in` refuses paths leaving `rootfs`, also through links already there.
        entry
            .unpack_in(rootfs)
            .with_context(|| format!("unpacking {}", path.display()))?;
    }
    Ok(())
}

/// `rootfs/relative`, when no component of it is a link (so it stays inside `rootfs`).
fn inside(rootfs: &Path, relative: &Path) -> anyhow::Result<PathBuf> {
    let mut path = rootfs.to_path_buf();
    for component in relative.components() {
        match component {
            std::path::Component::Normal(part) => {
                if std::fs::symlink_metadata(&path)
                    .is_ok_and(|metadata| metadata.file_type().is_symlink())
                {
                    bail!("{} passes through a link", relative.display());
                }
                path.push(part);
            }
            std::path::Component::CurDir => {}
            _ => bail!("{} leaves the image", relative.display()),
        }
    }
    Ok(path)
}

fn remove(path: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_dir() => std::fs::remove_dir_all(path)?,
        Ok(_) => std::fs::remove_file(path)?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error.into()),
    }
    Ok(())
}

/// Unpacks an image archive into `rootfs`: all its layers, in order.
pub fn unpack_image(archive: &Path, rootfs: &Path) -> anyhow::Result<()> {
    let scratch =
        std::env::temp_dir().join(format!("sandbase-image-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&scratch)?;
    let result = (|| {
        tar::Archive::new(open_layer(archive)?)
            .unpack(&scratch)
            .with_context(|| format!("unpacking {}", archive.display()))?;
        for layer in layers(&scratch)? {
            apply_layer(rootfs, &layer)?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}
