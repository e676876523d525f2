//! The sandboxes of this node: create from a template, destroy, and on start-up remove
//! whatever a previous run of the worker left behind (it may have crashed mid-sandbox).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::containerd::Containerd;
use crate::spec::{Limits, SandboxSpec, oci_spec};

#[derive(Debug, Clone)]
pub struct WorkerConfig {
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
}

pub struct Worker {
    containerd: Containerd,
    config: WorkerConfig,
}

/// A running sandbox, reachable through its agent's socket.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub id: String,
    pub socket: PathBuf,
}

/// How long a new sandbox's agent may take to listen.
const AGENT_START_TIMEOUT: Duration = Duration::from_secs(10);

impl Worker {
    /// Connects to containerd and removes every sandbox a previous run left behind;
    /// returns the worker and how many sandboxes it removed.
    pub async fn start(config: WorkerConfig) -> anyhow::Result<(Worker, usize)> {
        let containerd = Containerd::connect(&config.containerd_socket, &config.namespace).await?;
        std::fs::create_dir_all(&config.run_dir)
            .with_context(|| format!("creating {}", config.run_dir.display()))?;
        let worker = Worker { containerd, config };
        let removed = worker.reconcile().await?;
        Ok((worker, removed))
    }

    pub fn containerd(&self) -> &Containerd {
        &self.containerd
    }

    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Starts a sandbox from `template` and waits until its agent answers.
    pub async fn create(&self, template: &str, limits: Limits) -> anyhow::Result<Sandbox> {
        let id = format!("sbx-{}", uuid::Uuid::new_v4().simple());
        let result = self.try_create(&id, template, limits).await;
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
    ) -> anyhow::Result<Sandbox> {
        let control = self.control_dir(id);
        std::fs::create_dir(&control).with_context(|| format!("creating {}", control.display()))?;
        // Owned by the sandbox's root and closed to everyone else: user commands (another
        // uid inside the sandbox) cannot reach the agent's socket.
        std::os::unix::fs::chown(
            &control,
            Some(self.config.id_base),
            Some(self.config.id_base),
        )?;
        std::fs::set_permissions(
            &control,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )?;
        let spec = oci_spec(&SandboxSpec {
            hostname: "sandbox".to_owned(),
            host_id_base: self.config.id_base,
            agent_binary: path_string(&self.config.agent_binary)?,
            control_dir: path_string(&control)?,
            network_namespace: None,
            limits,
        });
        self.containerd.start_sandbox(id, template, &spec).await?;
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
        match std::fs::remove_dir_all(self.control_dir(id)) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error).context("removing the control directory"),
        }
    }

    /// On start nothing is running on purpose: every sandbox container, stray sandbox
    /// snapshot and control directory is an orphan.
    async fn reconcile(&self) -> anyhow::Result<usize> {
        let mut removed = 0;
        for id in self.containerd.sandbox_ids().await? {
            self.destroy(&id).await?;
            removed += 1;
        }
        for snapshot in self.containerd.sandbox_snapshots().await? {
            self.containerd.destroy_sandbox(&snapshot).await?;
        }
        for entry in std::fs::read_dir(&self.config.run_dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with("sbx-") {
                std::fs::remove_dir_all(entry.path())?;
            }
        }
        Ok(removed)
    }

    fn control_dir(&self, id: &str) -> PathBuf {
        self.config.run_dir.join(id)
    }
}

fn path_string(path: &Path) -> anyhow::Result<String> {
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{} is not valid UTF-8", path.display()))
}
