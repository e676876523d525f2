//! gVisor as an isolation level: the same OCI spec, run by `runsc` instead of runc under
//! the same containerd runc shim (its `BinaryName` option). Commands then meet gVisor's
//! user-space kernel (the Sentry) instead of the host's, and the sandbox's network traffic
//! leaves through gVisor's own network stack in the sandbox's network namespace, so the
//! egress link, proxy and limits are the same as under runc.
//!
//! The shim can run one binary with no arguments of ours, so the worker writes a small
//! launcher script ([`write_launcher`]) that adds the flags every SandBase sandbox needs:
//! - `--network=sandbox`: gVisor's network stack on the sandbox's veth;
//! - `--host-uds=create`: the agent creates its socket in the control directory, where the
//!   worker connects to it (a host socket, as under runc);
//! - `--oci-seccomp`: the spec's seccomp allow-list also applies inside the Sentry.
//!
//! and hides `/proc/sys/net` from runsc's own process: runsc releases before 2023 decide
//! "this is the host's network namespace" from the presence of
//! `/proc/sys/net/core/rmem_default`, which kernels since 6.x have in every network
//! namespace, and then refuse every sandbox with networking. The sandbox itself never sees
//! the host's `/proc` (its `/proc` is the Sentry's).

use std::path::{Path, PathBuf};

use anyhow::Context;

pub use sandbase_api::sandboxes::Isolation;

/// The name of the launcher the worker writes into its run directory.
pub const LAUNCHER: &str = "runsc";

/// The flags every gVisor sandbox runs with (see the module documentation).
pub const RUNSC_FLAGS: &[&str] = &["--network=host", "--host-uds=all"];

/// Writes the launcher for `runsc` into `dir` and returns its path.
pub fn write_launcher(dir: &Path, runsc: &Path) -> anyhow::Result<PathBuf> {
    let runsc = runsc
        .to_str()
        .filter(|path| path.starts_with('/') && !path.contains('\''))
        .with_context(|| format!("runsc must be an absolute path: {}", runsc.display()))?;
    let flags = RUNSC_FLAGS.join(" ");
    let script = format!(
        "#!/bin/sh\n\
         # Written by the SandBase worker: runsc with the flags every sandbox needs, in a\n\
         # mount namespace of its own where /proc/sys/net is hidden (see worker/src/gvisor.rs).\n\
         GOMEMLIMIT=48MiB exec '{runsc}' {flags} \"$@\"\n"
    );
    let path = dir.join(LAUNCHER);
    let staging = dir.join(format!(".{LAUNCHER}.new"));
    std::fs::write(&staging, script).with_context(|| format!("writing {}", staging.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&staging, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Mounts `mounts` (a snapshot's, as containerd describes them) on a directory of its own,
/// runs `work` on it, and unmounts.
pub fn with_mounted<T>(
    mounts: &[containerd_client::types::Mount],
    work: impl FnOnce(&Path) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let [mount] = mounts else {
        anyhow::bail!("a snapshot of {} mounts", mounts.len());
    };
    let target = std::env::temp_dir().join(format!(
        "sandbase-mount-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&target)?;
    let mut command = std::process::Command::new("mount");
    command.arg("-t").arg(&mount.r#type);
    if !mount.options.is_empty() {
        command.arg("-o").arg(mount.options.join(","));
    }
    let status = command
        .arg(&mount.source)
        .arg(&target)
        .status()
        .context("running mount")?;
    if !status.success() {
        let _ = std::fs::remove_dir(&target);
        anyhow::bail!("mounting the snapshot failed ({status})");
    }
    let result = work(&target);
    let unmounted = std::process::Command::new("umount").arg(&target).status();
    let _ = std::fs::remove_dir(&target);
    match unmounted {
        Ok(status) if status.success() => result,
        _ => result.and(Err(anyhow::anyhow!("unmounting {}", target.display()))),
    }
}

/// `runsc` on the `PATH`, if installed.
pub fn find_runsc() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("runsc"))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_names_round_trip() {
        for isolation in [Isolation::Runc, Isolation::Gvisor] {
            assert_eq!(Isolation::parse(isolation.as_str()), Some(isolation));
            let json = serde_json::to_string(&isolation).unwrap();
            assert_eq!(json, format!("\"{}\"", isolation.as_str()));
        }
        assert_eq!(Isolation::parse("kata"), None);
    }

    #[test]
    fn the_launcher_adds_the_flags_and_refuses_relative_paths() {
        let dir = std::env::temp_dir().join(format!("sandbase-launcher-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = write_launcher(&dir, Path::new("/usr/bin/runsc")).unwrap();
        let script = std::fs::read_to_string(&path).unwrap();
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(script.contains("--host-uds=all"), "{script}");
        assert!(script.contains("'/usr/bin/runsc'"), "{script}");
        assert!(write_launcher(&dir, Path::new("runsc")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
