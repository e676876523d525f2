//! The node's container runtime ([`Runtime`]): sandboxes created from a template on
//! containerd, destroyed, and on start-up whatever a previous run of the worker left behind
//! removed (it may have crashed mid-sandbox). It knows containers, not the gateway's ids:
//! `node::Node` keeps the sandboxes hosted for the gateway on top of it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::containerd::Containerd;
use crate::gvisor::Isolation;
use crate::spec::{Limits, SandboxSpec, oci_spec};

#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub containerd_socket: PathBuf,
    /// containerd namespace holding this worker's containers and snapshots.
    pub namespace: String,
    /// The statically linked agent, bind-mounted into every sandbox.
    pub agent_binary: PathBuf,
    /// Parent of the per-sandbox control directories (the agents' sockets).
    pub run_dir: PathBuf,
    /// First host uid/gid of the range sandbox user namespaces map to; templates' files
    /// are owned by this range.
    pub id_base: u32,
    /// gVisor's `runsc`, when this node offers gVisor sandboxes.
    pub runsc: Option<PathBuf>,
}

pub struct Runtime {
    containerd: Containerd,
    config: RuntimeConfig,
    /// The launcher the shim runs for gVisor sandboxes (written at start when `runsc` is set).
    gvisor_launcher: Option<PathBuf>,
    /// Serialises the making of templates' gVisor copies.
    gvisor_copies: tokio::sync::Mutex<()>,
    /// Every sandbox this worker started (or is starting) and has not destroyed: anything
    /// else of ours on the node is an orphan.
    live: Mutex<HashSet<String>>,
}

/// A running sandbox, reachable through its agent's socket.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub id: String,
    pub socket: PathBuf,
}

/// A sandbox asked for an isolation level this node does not offer.
#[derive(Debug, thiserror::Error)]
#[error("this node does not offer {} isolation", .0.as_str())]
pub struct IsolationUnavailable(pub Isolation);

/// How long a new sandbox's agent may take to listen.
const AGENT_START_TIMEOUT: Duration = Duration::from_secs(10);

/// Each sandbox's control directory is a tmpfs of its own this small (the agent's socket
/// and little else): whatever the sandbox's root writes there — many files, one big one —
/// stays within it and never reaches the node's `/run`.
const CONTROL_MOUNT_OPTIONS: &str = "size=16k,nr_inodes=16,mode=0700";
/// The run directory itself is a capped tmpfs (mounted at start when it is not a mount
/// point already): the worker's own files there cannot fill the node's `/run` either.
const RUN_DIR_MOUNT_OPTIONS: &str = "size=16m,nr_inodes=65536,mode=0755";
/// Where the runsc launcher lives: the one executable file under the run directory.
const LAUNCHER_MOUNT_OPTIONS: &str = "size=64k,nr_inodes=8,mode=0755";

impl Runtime {
    /// Connects to containerd and removes every sandbox a previous run left behind;
    /// returns the worker and how many sandboxes it removed.
    pub async fn start(config: RuntimeConfig) -> anyhow::Result<(Runtime, usize)> {
        let containerd = Containerd::connect(&config.containerd_socket, &config.namespace).await?;
        std::fs::create_dir_all(&config.run_dir)
            .with_context(|| format!("creating {}", config.run_dir.display()))?;
        if !is_mount_point(&config.run_dir)? {
            mount_tmpfs(&config.run_dir, RUN_DIR_MOUNT_OPTIONS)
                .with_context(|| format!("mounting a tmpfs on {}", config.run_dir.display()))?;
        }
        let resolv_conf = config.run_dir.join("resolv.conf");
        std::fs::write(&resolv_conf, crate::spec::RESOLV_CONF)
            .with_context(|| format!("writing {}", resolv_conf.display()))?;
        let gvisor_launcher = match &config.runsc {
            Some(runsc) => Some(install_launcher(&config.run_dir, runsc)?),
            None => None,
        };
        let worker = Runtime {
            containerd,
            config,
            gvisor_launcher,
            gvisor_copies: tokio::sync::Mutex::new(()),
            live: Mutex::new(HashSet::new()),
        };
        let removed = worker.remove_orphans().await?;
        Ok((worker, removed))
    }

    pub fn containerd(&self) -> &Containerd {
        &self.containerd
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// The isolation levels this node offers.
    pub fn isolations(&self) -> Vec<Isolation> {
        let mut offered = vec![Isolation::Runc];
        if self.gvisor_launcher.is_some() {
            offered.push(Isolation::Gvisor);
        }
        offered
    }

    /// Starts a runc sandbox from `template` and waits until its agent answers.
    pub async fn create(&self, template: &str, limits: Limits) -> anyhow::Result<Sandbox> {
        self.create_with_volumes(template, limits, Vec::new(), Isolation::Runc)
            .await
    }

    /// Like [`Runtime::create`], with host directories bind-mounted in (host path, path in
    /// the sandbox, read-only), isolated by `isolation`.
    pub async fn create_with_volumes(
        &self,
        template: &str,
        limits: Limits,
        volumes: Vec<(String, String, bool)>,
        isolation: Isolation,
    ) -> anyhow::Result<Sandbox> {
        let launcher = match isolation {
            Isolation::Runc => None,
            Isolation::Gvisor => {
                let launcher = self
                    .gvisor_launcher
                    .clone()
                    .ok_or(IsolationUnavailable(isolation))?;
                let _making = self.gvisor_copies.lock().await;
                self.containerd
                    .derive_gvisor_template(template, self.config.id_base)
                    .await?;
                Some(launcher)
            }
        };
        let id = format!("sbx-{}", uuid::Uuid::new_v4().simple());
        self.live().insert(id.clone());
        let result = self
            .try_create(&id, template, limits, volumes, launcher.as_deref())
            .await;
        if result.is_err() {
            // Leave nothing of a sandbox that did not start.
            let _ = self.destroy(&id).await;
        }
        result
    }

    async fn try_create(
        &self,
        id: &str,
        template: &str,
        limits: Limits,
        volumes: Vec<(String, String, bool)>,
        gvisor: Option<&Path>,
    ) -> anyhow::Result<Sandbox> {
        let control = self.control_dir(id);
        std::fs::create_dir(&control).with_context(|| format!("creating {}", control.display()))?;
        // A tiny tmpfs of its own, owned by the sandbox's root and closed to everyone else:
        // user commands (another uid inside the sandbox) cannot reach the agent's socket.
        // (Under gVisor the sandbox's root is the host's root as the gofer sees it.)
        let owner = if gvisor.is_some() {
            0
        } else {
            self.config.id_base
        };
        mount_tmpfs(
            &control,
            &format!("{CONTROL_MOUNT_OPTIONS},uid={owner},gid={owner}"),
        )
        .with_context(|| format!("mounting the control directory {}", control.display()))?;
        let spec = oci_spec(&SandboxSpec {
            hostname: "sandbox".to_owned(),
            host_id_base: self.config.id_base,
            agent_binary: path_string(&self.config.agent_binary)?,
            control_dir: path_string(&control)?,
            resolv_conf: path_string(&self.config.run_dir.join("resolv.conf"))?,
            network_namespace: None,
            limits,
            volumes,
            isolation: if gvisor.is_some() {
                Isolation::Gvisor
            } else {
                Isolation::Runc
            },
        });
        self.containerd
            .start_sandbox(id, template, &spec, gvisor)
            .await?;
        let socket = control.join("agent.sock");
        let deadline = Instant::now() + AGENT_START_TIMEOUT;
        while crate::agent_client::connect_without_following(&socket)
            .await
            .is_err()
        {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the sandbox's agent did not start"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(Sandbox {
            id: id.to_owned(),
            socket,
        })
    }

    /// Removes the sandbox's processes, container, snapshot and control directory.
    pub async fn destroy(&self, id: &str) -> anyhow::Result<()> {
        self.containerd.destroy_sandbox(id).await?;
        remove_control_dir(&self.control_dir(id)).context("removing the control directory")?;
        self.live().remove(id);
        Ok(())
    }

    /// How many sandboxes this worker has started and not destroyed (warm ones included).
    pub fn count(&self) -> usize {
        self.live().len()
    }

    /// Removes every sandbox container, sandbox snapshot and control directory of this
    /// namespace that this worker did not start (on start-up: all of them, since a crashed
    /// predecessor's sandboxes are nobody's now). Returns how many containers it removed.
    pub async fn remove_orphans(&self) -> anyhow::Result<usize> {
        let mut removed = 0;
        for id in self.containerd.sandbox_ids().await? {
            if !self.live().contains(&id) {
                self.destroy(&id).await?;
                removed += 1;
            }
        }
        for snapshot in self.containerd.sandbox_snapshots().await? {
            if !self.live().contains(&snapshot) {
                self.containerd.destroy_sandbox(&snapshot).await?;
            }
        }
        for entry in std::fs::read_dir(&self.config.run_dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("sbx-") && !self.live().contains(&name) {
                remove_control_dir(&entry.path())?;
            }
        }
        Ok(removed)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn control_dir(&self, id: &str) -> PathBuf {
        self.config.run_dir.join(id)
    }
}

/// Whether `path` is the root of a mount (its device differs from its parent's).
fn is_mount_point(path: &Path) -> anyhow::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::metadata(path)?;
    let parent = std::fs::metadata(path.join(".."))?;
    Ok(own.dev() != parent.dev() || own.ino() == parent.ino())
}

fn mount_tmpfs(path: &Path, options: &str) -> anyhow::Result<()> {
    mount_tmpfs_with(path, options, rustix::mount::MountFlags::NOEXEC)
}

fn mount_tmpfs_with(
    path: &Path,
    options: &str,
    flags: rustix::mount::MountFlags,
) -> anyhow::Result<()> {
    use rustix::mount::{MountFlags, mount};
    let options = std::ffi::CString::new(options)?;
    mount(
        "tmpfs",
        path,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | flags,
        Some(options.as_c_str()),
    )?;
    Ok(())
}

/// Writes the runsc launcher into a small tmpfs of its own under the run directory (which
/// is `noexec`: nothing there may be run but this).
fn install_launcher(run_dir: &Path, runsc: &Path) -> anyhow::Result<PathBuf> {
    let bin = run_dir.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    if !is_mount_point(&bin)? {
        mount_tmpfs_with(
            &bin,
            LAUNCHER_MOUNT_OPTIONS,
            rustix::mount::MountFlags::empty(),
        )
        .with_context(|| format!("mounting a tmpfs on {}", bin.display()))?;
    }
    crate::gvisor::write_launcher(&bin, runsc)
}

/// Removes a worker's run directory after it stopped: its tmpfs unmounted (lazily), then
/// the directory. For tests and tools that made a run directory of their own.
pub fn remove_run_dir(path: &Path) -> anyhow::Result<()> {
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                remove_control_dir(&entry.path())?;
            }
        }
    }
    remove_control_dir(path)
}

/// Unmounts a control directory's tmpfs (lazily: a process may still hold it) and removes
/// the directory; one already gone is fine.
fn remove_control_dir(path: &Path) -> anyhow::Result<()> {
    use rustix::mount::{UnmountFlags, unmount};
    match unmount(path, UnmountFlags::DETACH) {
        Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {}
        Err(error) => return Err(error.into()),
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error.into()),
    }
}

fn path_string(path: &Path) -> anyhow::Result<String> {
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{} is not valid UTF-8", path.display()))
}
