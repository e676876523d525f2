//! Root file systems for templates.
//!
//! `busybox` builds the smallest useful one from the host's statically linked busybox:
//! a shell and the usual tools in a few megabytes, for tests and quick experiments.
//! Every file is owned by the sandbox id range once, when the template is built, so no
//! sandbox needs its files re-owned (containerd 1.6 with runc 1.1 has no idmapped mounts).

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::spec::SANDBOX_USER;

/// The statically linked busybox of the `busybox-static` package.
pub const HOST_BUSYBOX: &str = "/bin/busybox";

/// Fills `rootfs` with busybox, its applets, a passwd with `root` and `user` (uid 1000),
/// and the mount points the sandbox spec needs; owned by the range starting at `id_base`.
pub fn busybox(rootfs: &Path, id_base: u32) -> anyhow::Result<()> {
    for directory in [
        "bin",
        "proc",
        "sys",
        "dev",
        "tmp",
        "etc",
        "root",
        "mnt",
        "home/user",
        ".sandbase/run",
    ] {
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
    // The agent's bind-mount target.
    std::fs::write(rootfs.join(".sandbase/agent"), b"")?;
    std::fs::write(
        rootfs.join("etc/passwd"),
        format!(
            "root:x:0:0:root:/root:/bin/sh\nuser:x:{SANDBOX_USER}:{SANDBOX_USER}:user:/home/user:/bin/sh\n"
        ),
    )?;
    std::fs::write(
        rootfs.join("etc/group"),
        format!("root:x:0:\nuser:x:{SANDBOX_USER}:\n"),
    )?;
    chown_tree(rootfs, id_base)?;
    let user = id_base + SANDBOX_USER;
    std::os::unix::fs::chown(rootfs.join("home/user"), Some(user), Some(user))?;
    Ok(())
}

/// Gives everything under `root` (links themselves, not their targets) to `id`.
fn chown_tree(root: &Path, id: u32) -> anyhow::Result<()> {
    std::os::unix::fs::lchown(root, Some(id), Some(id))?;
    if std::fs::symlink_metadata(root)?.is_dir() {
        for entry in std::fs::read_dir(root)? {
            chown_tree(&entry?.path(), id)?;
        }
    }
    Ok(())
}
