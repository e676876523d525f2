//! Sandbox containers through containerd's gRPC API: template snapshots, containers,
//! tasks, and their removal. Only the lifecycle goes through containerd; commands and files
//! go to the agent inside the container.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use containerd_client::services::v1::container::Runtime;
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::namespaces_client::NamespacesClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, ListSnapshotsRequest, PrepareSnapshotRequest, RemoveSnapshotRequest,
    StatSnapshotRequest,
};
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{
    Container, CreateContainerRequest, CreateTaskRequest, DeleteContainerRequest,
    DeleteTaskRequest, GetRequest, KillRequest, ListContainersRequest, PauseTaskRequest,
    ResumeTaskRequest, StartRequest, UpdateTaskRequest,
};
use containerd_client::tonic::transport::Channel;
use containerd_client::tonic::{Code, Request};
use containerd_client::with_namespace;

/// The runtime shim every sandbox runs under (runc, v2 shim API).
pub const RUNTIME: &str = "io.containerd.runc.v2";
const SNAPSHOTTER: &str = "overlayfs";
const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
const RESOURCES_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources";
const SIGKILL: u32 = 9;
/// Label on every sandbox container (value: its template), so a restarted worker finds them.
pub const SANDBOX_LABEL: &str = "sandbase.sandbox";

#[derive(Clone)]
pub struct Containerd {
    channel: Channel,
    namespace: String,
}

/// The committed snapshot of a template.
pub fn template_snapshot(name: &str) -> String {
    format!("sandbase/template/{name}")
}

/// A template's copy for gVisor sandboxes: its files with their own ids, not shifted into
/// the node's range (gVisor sandboxes have no user namespace on the host).
pub fn gvisor_template_snapshot(name: &str) -> String {
    format!("sandbase/gvisor-template/{name}")
}

/// The runc shim's options type, and the field of `Options` naming the OCI runtime binary
/// (containerd's runtime/runc/options: `string binary_name = 6`).
const RUNC_OPTIONS_TYPE_URL: &str = "containerd.runc.v1.Options";
const BINARY_NAME_FIELD: u8 = 6;

/// The shim options running `binary` instead of runc (protobuf, one string field).
fn runc_options(binary: &Path) -> anyhow::Result<prost_types::Any> {
    let name = binary.to_str().context("the runtime's path is not UTF-8")?;
    let mut value = vec![BINARY_NAME_FIELD << 3 | 2];
    let mut length = name.len();
    while length >= 0x80 {
        value.push((length as u8 & 0x7f) | 0x80);
        length >>= 7;
    }
    value.push(length as u8);
    value.extend_from_slice(name.as_bytes());
    Ok(prost_types::Any {
        type_url: RUNC_OPTIONS_TYPE_URL.to_owned(),
        value,
    })
}

impl Containerd {
    pub async fn connect(socket: &Path, namespace: &str) -> anyhow::Result<Containerd> {
        let channel = containerd_client::connect(socket)
            .await
            .with_context(|| format!("connecting to containerd at {}", socket.display()))?;
        Ok(Containerd {
            channel,
            namespace: namespace.to_owned(),
        })
    }

    pub async fn template_exists(&self, name: &str) -> anyhow::Result<bool> {
        self.snapshot_exists(&template_snapshot(name)).await
    }

    async fn snapshot_exists(&self, key: &str) -> anyhow::Result<bool> {
        let request = StatSnapshotRequest {
            snapshotter: SNAPSHOTTER.to_owned(),
            key: key.to_owned(),
        };
        match SnapshotsClient::new(self.channel.clone())
            .stat(with_namespace!(request, self.namespace))
            .await
        {
            Ok(_) => Ok(true),
            Err(status) if status.code() == Code::NotFound => Ok(false),
            Err(status) => Err(status).context("reading a template snapshot"),
        }
    }

    /// Builds a template snapshot: an empty active snapshot is filled by `populate` (given
    /// its directory), then committed under the template's name.
    pub async fn build_template(
        &self,
        name: &str,
        populate: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let key = format!("sandbase/template-build/{name}");
        let mut snapshots = SnapshotsClient::new(self.channel.clone());
        // A build interrupted earlier leaves its active snapshot behind.
        let _ = snapshots
            .remove(with_namespace!(
                RemoveSnapshotRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    key: key.clone(),
                },
                self.namespace
            ))
            .await;
        let prepared = snapshots
            .prepare(with_namespace!(
                PrepareSnapshotRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    key: key.clone(),
                    labels: gc_root(),
                    ..Default::default()
                },
                self.namespace
            ))
            .await
            .context("preparing a template snapshot")?
            .into_inner();
        // Without a parent, the snapshot is one bind mount of an empty directory.
        let directory = match prepared.mounts.as_slice() {
            [mount] if mount.r#type == "bind" => PathBuf::from(&mount.source),
            other => bail!("unexpected mounts for an empty snapshot: {other:?}"),
        };
        if let Err(error) = populate(&directory) {
            // Nothing of a failed build stays.
            self.forget_snapshot(&key).await;
            return Err(error);
        }
        self.commit_template(key, template_snapshot(name)).await
    }

    /// Makes the gVisor copy of template `name` (built for the id range at `base`) unless it
    /// exists: a snapshot on top of the template whose files get their own ids back. Once per
    /// template and node; costs a copy of the template's files.
    pub async fn derive_gvisor_template(&self, name: &str, base: u32) -> anyhow::Result<()> {
        let committed = gvisor_template_snapshot(name);
        if self.snapshot_exists(&committed).await? {
            return Ok(());
        }
        let key = format!("sandbase/template-build/{name}@gvisor");
        // A copy interrupted earlier leaves its active snapshot behind.
        self.forget_snapshot(&key).await;
        let prepared = SnapshotsClient::new(self.channel.clone())
            .prepare(with_namespace!(
                PrepareSnapshotRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    key: key.clone(),
                    parent: template_snapshot(name),
                    labels: gc_root(),
                },
                self.namespace
            ))
            .await
            .context("preparing the template's gVisor copy")?
            .into_inner();
        let unshifted = tokio::task::block_in_place(|| {
            crate::gvisor::with_mounted(&prepared.mounts, |root| {
                crate::templates::unshift_ids(root, base)
            })
        });
        if let Err(error) = unshifted {
            self.forget_snapshot(&key).await;
            return Err(error);
        }
        self.commit_template(key, committed).await
    }

    /// Removes an active snapshot that will not be committed (best effort).
    async fn forget_snapshot(&self, key: &str) {
        let _ = SnapshotsClient::new(self.channel.clone())
            .remove(with_namespace!(
                RemoveSnapshotRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    key: key.to_owned(),
                },
                self.namespace
            ))
            .await;
    }

    /// Commits a built template snapshot under `name`. Nothing else references a template:
    /// without a root label containerd's garbage collector would remove it.
    async fn commit_template(&self, key: String, name: String) -> anyhow::Result<()> {
        SnapshotsClient::new(self.channel.clone())
            .commit(with_namespace!(
                CommitSnapshotRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    name,
                    key,
                    labels: [(
                        "containerd.io/gc.root".to_owned(),
                        "sandbase-template".to_owned()
                    )]
                    .into(),
                },
                self.namespace
            ))
            .await
            .context("committing a template snapshot")?;
        Ok(())
    }

    /// Creates and starts a sandbox container on a fresh snapshot of `template`, under runc
    /// or, given `gvisor` (the runsc launcher), under gVisor on the template's gVisor copy.
    pub async fn start_sandbox(
        &self,
        id: &str,
        template: &str,
        spec: &serde_json::Value,
        gvisor: Option<&Path>,
    ) -> anyhow::Result<()> {
        let (parent, options) = match gvisor {
            None => (template_snapshot(template), None),
            Some(launcher) => (
                gvisor_template_snapshot(template),
                Some(runc_options(launcher)?),
            ),
        };
        let prepared = SnapshotsClient::new(self.channel.clone())
            .prepare(with_namespace!(
                PrepareSnapshotRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    key: id.to_owned(),
                    parent,
                    labels: gc_root(),
                },
                self.namespace
            ))
            .await
            .context("preparing the sandbox snapshot")?
            .into_inner();
        let container = Container {
            id: id.to_owned(),
            runtime: Some(Runtime {
                name: RUNTIME.to_owned(),
                options: options.clone(),
            }),
            spec: Some(prost_types::Any {
                type_url: SPEC_TYPE_URL.to_owned(),
                value: serde_json::to_vec(spec)?,
            }),
            snapshotter: SNAPSHOTTER.to_owned(),
            snapshot_key: id.to_owned(),
            labels: [(SANDBOX_LABEL.to_owned(), template.to_owned())].into(),
            ..Default::default()
        };
        ContainersClient::new(self.channel.clone())
            .create(with_namespace!(
                CreateContainerRequest {
                    container: Some(container)
                },
                self.namespace
            ))
            .await
            .context("creating the container")?;
        let mut tasks = TasksClient::new(self.channel.clone());
        tasks
            .create(with_namespace!(
                CreateTaskRequest {
                    container_id: id.to_owned(),
                    rootfs: prepared.mounts,
                    options,
                    ..Default::default()
                },
                self.namespace
            ))
            .await
            .context("creating the task")?;
        tasks
            .start(with_namespace!(
                StartRequest {
                    container_id: id.to_owned(),
                    ..Default::default()
                },
                self.namespace
            ))
            .await
            .context("starting the task")?;
        Ok(())
    }

    /// Names of the templates built in this namespace.
    pub async fn templates(&self) -> anyhow::Result<Vec<String>> {
        let prefix = template_snapshot("");
        Ok(self
            .snapshot_names()
            .await?
            .into_iter()
            .filter_map(|name| name.strip_prefix(&prefix).map(str::to_owned))
            .collect())
    }

    /// Names of every snapshot in this namespace.
    async fn snapshot_names(&self) -> anyhow::Result<Vec<String>> {
        let mut stream = SnapshotsClient::new(self.channel.clone())
            .list(with_namespace!(
                ListSnapshotsRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    ..Default::default()
                },
                self.namespace
            ))
            .await
            .context("listing snapshots")?
            .into_inner();
        let mut names = Vec::new();
        while let Some(page) = stream.message().await.context("listing snapshots")? {
            names.extend(page.info.into_iter().map(|info| info.name));
        }
        Ok(names)
    }

    /// Removes a template's snapshot and its gVisor copy (refused by the snapshotter while
    /// sandboxes started from them exist).
    pub async fn remove_template(&self, name: &str) -> anyhow::Result<()> {
        let copy = SnapshotsClient::new(self.channel.clone())
            .remove(with_namespace!(
                RemoveSnapshotRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    key: gvisor_template_snapshot(name),
                },
                self.namespace
            ))
            .await;
        tolerate_missing(copy.map(|_| ()), "removing the template's gVisor copy")?;
        SnapshotsClient::new(self.channel.clone())
            .remove(with_namespace!(
                RemoveSnapshotRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    key: template_snapshot(name),
                },
                self.namespace
            ))
            .await
            .context("removing the template")?;
        Ok(())
    }

    /// Removes this client's namespace, which must hold nothing any more (a node's namespace
    /// outlives its sandboxes; tests give every worker one of their own and remove it).
    pub async fn remove_namespace(&self) -> anyhow::Result<()> {
        NamespacesClient::new(self.channel.clone())
            .delete(containerd_client::services::v1::DeleteNamespaceRequest {
                name: self.namespace.clone(),
            })
            .await
            .with_context(|| format!("removing the containerd namespace {}", self.namespace))?;
        Ok(())
    }

    /// The host pid of a sandbox's first process.
    pub async fn task_pid(&self, id: &str) -> anyhow::Result<u32> {
        let answer = TasksClient::new(self.channel.clone())
            .get(with_namespace!(
                GetRequest {
                    container_id: id.to_owned(),
                    ..Default::default()
                },
                self.namespace
            ))
            .await
            .context("reading the sandbox's task")?
            .into_inner();
        answer
            .process
            .map(|process| process.pid)
            .filter(|pid| *pid > 0)
            .context("the sandbox's task has no process")
    }

    /// Freezes every process of a sandbox (the cgroup freezer under runc; gVisor stops its
    /// Sentry's tasks): memory is kept, no CPU is used.
    pub async fn pause_task(&self, id: &str) -> anyhow::Result<()> {
        TasksClient::new(self.channel.clone())
            .pause(with_namespace!(
                PauseTaskRequest {
                    container_id: id.to_owned(),
                },
                self.namespace
            ))
            .await
            .context("pausing the sandbox's task")?;
        Ok(())
    }

    /// Thaws a paused sandbox.
    pub async fn resume_task(&self, id: &str) -> anyhow::Result<()> {
        TasksClient::new(self.channel.clone())
            .resume(with_namespace!(
                ResumeTaskRequest {
                    container_id: id.to_owned(),
                },
                self.namespace
            ))
            .await
            .context("resuming the sandbox's task")?;
        Ok(())
    }

    /// Changes a running sandbox's cgroup limits (cpu, memory, pids).
    pub async fn update_limits(
        &self,
        id: &str,
        limits: crate::spec::Limits,
        isolation: crate::gvisor::Isolation,
    ) -> anyhow::Result<()> {
        let mut resources = crate::spec::linux_resources(limits, isolation);
        // Device rules are fixed at creation.
        if let Some(object) = resources.as_object_mut() {
            object.remove("devices");
        }
        TasksClient::new(self.channel.clone())
            .update(with_namespace!(
                UpdateTaskRequest {
                    container_id: id.to_owned(),
                    resources: Some(prost_types::Any {
                        type_url: RESOURCES_TYPE_URL.to_owned(),
                        value: serde_json::to_vec(&resources)?,
                    }),
                    ..Default::default()
                },
                self.namespace
            ))
            .await
            .context("updating the sandbox's limits")?;
        Ok(())
    }

    /// Ids of every sandbox container in this namespace.
    pub async fn sandbox_ids(&self) -> anyhow::Result<Vec<String>> {
        let listed = ContainersClient::new(self.channel.clone())
            .list(with_namespace!(
                ListContainersRequest {
                    filters: vec![format!("labels.\"{SANDBOX_LABEL}\"")],
                },
                self.namespace
            ))
            .await
            .context("listing containers")?
            .into_inner();
        Ok(listed
            .containers
            .into_iter()
            .map(|container| container.id)
            .collect())
    }

    /// Names of the active (per-sandbox) snapshots, committed templates excluded.
    pub async fn sandbox_snapshots(&self) -> anyhow::Result<Vec<String>> {
        Ok(self
            .snapshot_names()
            .await?
            .into_iter()
            .filter(|name| !name.starts_with("sandbase/"))
            .collect())
    }

    /// Kills every process of the sandbox and removes its task, container and snapshot.
    /// Each step tolerates what is already gone, so it also cleans up half-made sandboxes.
    pub async fn destroy_sandbox(&self, id: &str) -> anyhow::Result<()> {
        let mut tasks = TasksClient::new(self.channel.clone());
        let killed = tasks
            .kill(with_namespace!(
                KillRequest {
                    container_id: id.to_owned(),
                    signal: SIGKILL,
                    all: true,
                    ..Default::default()
                },
                self.namespace
            ))
            .await;
        // A task that already stopped (a gVisor sandbox whose Sentry died: runsc answers
        // "sandbox is not running") cannot be killed, only deleted: go on to the delete,
        // which fails by itself if the task is still there.
        if let Err(status) = killed
            && status.code() != Code::NotFound
        {
            tracing::debug!(%id, error = %status.message(), "killing the task");
        }
        // The task can only be deleted once it has stopped.
        let mut attempts = 0;
        loop {
            let deleted = tasks
                .delete(with_namespace!(
                    DeleteTaskRequest {
                        container_id: id.to_owned(),
                    },
                    self.namespace
                ))
                .await;
            match deleted {
                Ok(_) => break,
                Err(status) if status.code() == Code::NotFound => break,
                Err(_) if attempts < 100 => {
                    attempts += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(status) => return Err(status).context("deleting the task"),
            }
        }
        let deleted = ContainersClient::new(self.channel.clone())
            .delete(with_namespace!(
                DeleteContainerRequest { id: id.to_owned() },
                self.namespace
            ))
            .await;
        tolerate_missing(deleted.map(|_| ()), "deleting the container")?;
        let removed = SnapshotsClient::new(self.channel.clone())
            .remove(with_namespace!(
                RemoveSnapshotRequest {
                    snapshotter: SNAPSHOTTER.to_owned(),
                    key: id.to_owned(),
                },
                self.namespace
            ))
            .await;
        tolerate_missing(removed.map(|_| ()), "removing the snapshot")
    }
}

/// Snapshots SandBase makes are referenced by nothing containerd knows of (no image, and no
/// container yet while one is being prepared or built): without a root label containerd's
/// garbage collector may remove them at any moment. SandBase removes them itself.
fn gc_root() -> std::collections::HashMap<String, String> {
    [("containerd.io/gc.root".to_owned(), "sandbase".to_owned())].into()
}

fn tolerate_missing(
    result: Result<(), containerd_client::tonic::Status>,
    what: &str,
) -> anyhow::Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(status) if status.code() == Code::NotFound => Ok(()),
        Err(status) => Err(status).context(what.to_owned()),
    }
}
