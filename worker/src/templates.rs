//! Root file systems for templates.
//!
//! - `busybox`: the smallest useful one, from the host's statically linked busybox — a shell
//!   and the usual tools in a few megabytes, for tests and quick experiments.
//! - `from_tarball`: any root file system archive, such as the Debian `base` that
//!   `scripts/setup` builds with mmdebstrap (bash, coreutils, python3, pip, curl, git, CA
//!   certificates).
//!
//! Every file's owner is shifted into the sandbox id range once, when the template is built,
//! so no sandbox needs its files re-owned (containerd 1.6 with runc 1.1 has no idmapped
//! mounts). Each template also gets what the sandbox spec needs: the agent's mount points and
//! the unprivileged `user` (uid 1000) whose home is `/work`.

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::spec::SANDBOX_USER;

/// The statically linked busybox of the `busybox-static` package.
pub const HOST_BUSYBOX: &str = "/bin/busybox";

/// Fills `rootfs` with busybox and its applets, for the range starting at `id_base`.
pub fn busybox(rootfs: &Path, id_base: u32) -> anyhow::Result<()> {
    for directory in ["bin", "proc", "sys", "dev", "tmp", "etc", "root", "mnt"] {
        std::fs::create_dir_all(rootfs.join(directory))?;
    }
    std::fs::copy(HOST_BUSYBOX, rootfs.join("bin/busybox"))
        .with_context(|| format!("copying {HOST_BUSYBOX} (install busybox-static)"))?;
    let applets = Command::new(HOST_BUSYBOX)
        .arg("--list")
        .output()
        .context("listing busybox applets")?;
    for applet in String::from_utf8_lossy(&applets.stdout).lines() {
        if applet != "busybox" && !applet.contains('/') {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
        }
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\n")?;
    prepare(rootfs, "/bin/sh")?;
    shift_ids(rootfs, id_base)
}

/// Unpacks a root file system archive (owners kept) into `rootfs`, for the range starting
/// at `id_base`.
pub fn from_tarball(rootfs: &Path, tarball: &Path, id_base: u32) -> anyhow::Result<()> {
    let status = Command::new("tar")
        .args([
            "--extract",
            "--numeric-owner",
            "--preserve-permissions",
            "--file",
        ])
        .arg(tarball)
        .arg("--directory")
        .arg(rootfs)
        .status()
        .context("running tar")?;
    anyhow::ensure!(status.success(), "unpacking {} failed", tarball.display());
    prepare(rootfs, "/bin/bash")?;
    shift_ids(rootfs, id_base)
}

/// Fills `rootfs` from an OCI image layout or Docker archive (`docker save`, `skopeo copy
/// … oci-archive:`), for the range starting at `id_base`.
pub fn from_image_archive(rootfs: &Path, archive: &Path, id_base: u32) -> anyhow::Result<()> {
    crate::images::unpack_image(archive, rootfs)?;
    finish_image(rootfs, id_base)
}

/// Fills `rootfs` from layer files (bottom first), for the range starting at `id_base`.
pub fn from_layers(
    rootfs: &Path,
    layers: &[std::path::PathBuf],
    id_base: u32,
) -> anyhow::Result<()> {
    for layer in layers {
        crate::images::apply_layer(rootfs, layer)?;
    }
    finish_image(rootfs, id_base)
}

fn finish_image(rootfs: &Path, id_base: u32) -> anyhow::Result<()> {
    // What `prepare` writes must not be a link an image planted toward the host's files.
    for directory in ["etc", "proc", "sys", "dev", "tmp", "work", ".sandbase"] {
        let path = rootfs.join(directory);
        if std::fs::symlink_metadata(&path).is_ok_and(|metadata| !metadata.is_dir()) {
            anyhow::ensure!(directory != "etc", "the image's /etc is not a directory");
            std::fs::remove_file(&path)?;
        }
    }
    std::fs::create_dir_all(rootfs.join("etc"))?;
    for file in ["etc/passwd", "etc/group"] {
        let path = rootfs.join(file);
        anyhow::ensure!(
            !std::fs::symlink_metadata(&path).is_ok_and(|metadata| !metadata.is_file()),
            "the image's /{file} is not a regular file"
        );
    }
    // Looked up without following links: the image's links point into the image.
    let shell = if std::fs::symlink_metadata(rootfs.join("usr/bin/bash")).is_ok() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    prepare(rootfs, shell)?;
    shift_ids(rootfs, id_base)
}

/// Adds the agent's mount points and the sandbox user to a root file system.
fn prepare(rootfs: &Path, shell: &str) -> anyhow::Result<()> {
    for directory in ["etc", "proc", "sys", "dev", "tmp", "work", ".sandbase/run"] {
        std::fs::create_dir_all(rootfs.join(directory))?;
    }
    // runc gives a tmpfs the mode of the directory it covers: /tmp must be world-writable
    // and sticky.
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    // The agent's bind-mount target.
    std::fs::write(rootfs.join(".sandbase/agent"), b"")?;
    // The user's home is the sandbox's writable /work (a size-capped tmpfs mounted there).
    append_unless_present(
        &rootfs.join("etc/passwd"),
        &format!(":{SANDBOX_USER}:"),
        &format!("user:x:{SANDBOX_USER}:{SANDBOX_USER}:user:/work:{shell}\n"),
    )?;
    append_unless_present(
        &rootfs.join("etc/group"),
        &format!(":{SANDBOX_USER}:"),
        &format!("user:x:{SANDBOX_USER}:\n"),
    )
}

fn append_unless_present(file: &Path, marker: &str, line: &str) -> anyhow::Result<()> {
    let mut content = std::fs::read_to_string(file).unwrap_or_default();
    if content.lines().any(|existing| existing.contains(marker)) {
        return Ok(());
    }
    if !content.is_empty() && !content.ends_with('\n') {
        content.push('\n');
    }
    content.push_str(line);
    std::fs::write(file, content)?;
    Ok(())
}

/// Adds `base` to the owner and group of everything under `root`, links included (not their
/// targets), each inode once (hard links), keeping set-id bits that `chown` clears.
pub fn shift_ids(root: &Path, base: u32) -> anyhow::Result<()> {
    let mut seen = HashSet::new();
    let up = |id: u32| id.checked_add(base).context("id out of range");
    shift(root, &up, &mut seen).with_context(|| format!("shifting owners under {}", root.display()))
}

/// The reverse of [`shift_ids`]: the template's own ids back (for gVisor, whose sandboxes
/// have no user namespace on the host). An id outside the range becomes `nobody`.
pub fn unshift_ids(root: &Path, base: u32) -> anyhow::Result<()> {
    let mut seen = HashSet::new();
    let down = |id: u32| {
        Ok(id
            .checked_sub(base)
            .filter(|id| *id < crate::spec::ID_RANGE)
            .unwrap_or(NOBODY))
    };
    shift(root, &down, &mut seen)
        .with_context(|| format!("unshifting owners under {}", root.display()))
}

const NOBODY: u32 = 65_534;

type IdMap<'a> = &'a dyn Fn(u32) -> anyhow::Result<u32>;

fn shift(path: &Path, map: IdMap<'_>, seen: &mut HashSet<(u64, u64)>) -> anyhow::Result<()> {
    let metadata = std::fs::symlink_metadata(path)?;
    if seen.insert((metadata.dev(), metadata.ino())) {
        let uid = map(metadata.uid())?;
        let gid = map(metadata.gid())?;
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
        if !metadata.file_type().is_symlink() && metadata.mode() & 0o6000 != 0 {
            std::fs::set_permissions(
                path,
                std::fs::Permissions::from_mode(metadata.mode() & 0o7777),
            )?;
        }
    }
    if metadata.is_dir() {
        for entry in std::fs::read_dir(path)? {
            shift(&entry?.path(), map, seen)?;
        }
    }
    Ok(())
}
