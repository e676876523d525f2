//! The node: the sandboxes this worker hosts for the gateway, keyed by the gateway's ids,
//! with their warm pools, capacity, defaults and background processes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use sandbase_api::internal::{CreateSandbox, TemplateInfo};
use sandbase_api::sandboxes::{Isolation, Resources};
use uuid::Uuid;

use crate::agent_client::AgentClient;
use crate::background::{OutputBudget, Retained, SANDBOX_OUTPUT_BUDGET, WORKER_OUTPUT_CEILING};
pub use crate::error::NodeError;
use crate::exec::{Hosted, user};
use crate::pool::WarmPool;
use crate::runtime::{Runtime, Sandbox};
use crate::spec::{Limits, WORK_DIR};
pub use crate::volumes::{Volume, reserved_mount_path};

/// What the node is configured with.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Most sandboxes hosted at once (warm ones not counted).
    pub capacity: usize,
    /// Warm pool size per template, for sandboxes of the default size.
    pub pools: Vec<(String, usize)>,
    /// The size warm sandboxes are started with.
    pub default_limits: Limits,
    /// Most output a background process keeps per stream (older output is dropped).
    pub process_output_limit: usize,
    /// Host directories sandboxes may ask to mount, by name.
    pub volumes: BTreeMap<String, Volume>,
    /// Egress through the node's proxy; without it sandboxes have loopback only.
    pub egress: Option<crate::network::EgressConfig>,
    /// Memory sandboxes may reserve, in MiB, before overcommit (0: the machine's memory
    /// less [`NODE_MEMORY_RESERVE_MB`] for the node's own processes).
    pub memory_mb: u64,
    /// How far reservations may exceed `memory_mb` (1.0: not at all).
    pub memory_overcommit: f64,
    /// CPU sandboxes may reserve, in thousandths of a core, before overcommit (0: the
    /// machine's cores).
    pub cpu_millis: u64,
    /// How far CPU reservations may exceed `cpu_millis` (CPU is shared, not lost: idle
    /// sandboxes leave it to busy ones, so nodes usually overcommit it several times).
    pub cpu_overcommit: f64,
}

/// Memory kept back for the worker, containerd, the proxy and the system when the
/// allocatable memory is read off the machine.
pub const NODE_MEMORY_RESERVE_MB: u64 = 1024;

/// The machine's memory in MiB (`MemTotal`).
fn machine_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .map_or(0, |kib| kib / 1024)
}

pub struct Node {
    runtime: Arc<Runtime>,
    config: NodeConfig,
    pools: HashMap<String, Arc<WarmPool>>,
    hosted: RwLock<HashMap<Uuid, Arc<Hosted>>>,
    /// Creates in progress, counted against capacity.
    creating: AtomicUsize,
    /// Usage samples waiting for the gateway.
    usage: crate::usage::Outbox,
    network: Option<Arc<crate::network::Network>>,
    /// Memory (MiB) and CPU (millicores) reserved by creates in progress.
    creating_memory: AtomicU64,
    creating_cpu: AtomicU64,
    /// Memory (MiB) and CPU (millicores) sandboxes may reserve in all.
    allocatable_memory_mb: u64,
    allocatable_cpu_millis: u64,
    /// Background output kept for every sandbox, against the worker's ceiling.
    output: Arc<Retained>,
    health: crate::health::CreateHealth,
    /// Where terminal recordings go (the gateway), once the service has set it.
    recordings: std::sync::OnceLock<Arc<crate::recording::RecordingSink>>,
    /// Bytes preview connections carried, until they are reported as egress.
    pub(crate) previews: crate::usage::PreviewMeter,
}

impl Node {
    /// Starts the warm pools; the worker has already removed what a predecessor left.
    pub fn start(
        runtime: Arc<Runtime>,
        config: NodeConfig,
        network: Option<Arc<crate::network::Network>>,
    ) -> Arc<Node> {
        let pools = config
            .pools
            .iter()
            .filter(|(_, size)| *size > 0)
            .map(|(template, size)| {
                (
                    template.clone(),
                    WarmPool::start(Arc::clone(&runtime), template, config.default_limits, *size),
                )
            })
            .collect();
        let memory_mb = match config.memory_mb {
            0 => machine_memory_mb().saturating_sub(NODE_MEMORY_RESERVE_MB),
            given => given,
        };
        let cpu_millis = match config.cpu_millis {
            0 => {
                std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as u64 * 1000
            }
            given => given,
        };
        Arc::new(Node {
            allocatable_memory_mb: (memory_mb as f64 * config.memory_overcommit.max(0.0)) as u64,
            allocatable_cpu_millis: (cpu_millis as f64 * config.cpu_overcommit.max(0.0)) as u64,
            creating_memory: AtomicU64::new(0),
            creating_cpu: AtomicU64::new(0),
            output: Retained::new(WORKER_OUTPUT_CEILING),
            health: crate::health::CreateHealth::default(),
            recordings: std::sync::OnceLock::new(),
            previews: crate::usage::PreviewMeter::default(),
            runtime,
            config,
            pools,
            hosted: RwLock::new(HashMap::new()),
            creating: AtomicUsize::new(0),
            usage: crate::usage::Outbox::default(),
            network,
        })
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    pub fn capacity(&self) -> usize {
        self.config.capacity
    }

    pub fn ids(&self) -> Vec<Uuid> {
        self.read().keys().copied().collect()
    }

    pub fn get(&self, id: Uuid) -> Result<Arc<Hosted>, NodeError> {
        self.read()
            .get(&id)
            .cloned()
            .ok_or(NodeError::SandboxNotFound)
    }

    /// The templates this node has, with their warm sandboxes.
    pub async fn templates(&self) -> anyhow::Result<Vec<TemplateInfo>> {
        let mut templates: Vec<TemplateInfo> = self
            .runtime
            .containerd()
            .templates()
            .await?
            .into_iter()
            .map(|name| TemplateInfo {
                warm: self.pools.get(&name).map_or(0, |pool| pool.ready() as u32),
                name,
            })
            .collect();
        templates.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(templates)
    }

    /// Starts (or claims from the warm pool) a sandbox for the gateway's `request`.
    pub async fn create(&self, request: CreateSandbox) -> Result<(), NodeError> {
        if self.read().contains_key(&request.id) {
            return Err(NodeError::Exists);
        }
        let in_progress = self.creating.fetch_add(1, Ordering::AcqRel);
        let _release = Release(&self.creating);
        if self.read().len() + in_progress >= self.config.capacity {
            return Err(NodeError::AtCapacity);
        }
        if !self.runtime.isolations().contains(&request.isolation) {
            return Err(NodeError::Invalid(format!(
                "this worker does not offer {} isolation",
                request.isolation.as_str()
            )));
        }
        let limits = limits_of(request.resources);
        // Memory is reserved, not only counted: a node full by memory is full (a gVisor
        // sandbox's Sentry included).
        let memory = u64::from(limits.memory_mb)
            + match request.isolation {
                Isolation::Runc => 0,
                Isolation::Gvisor => u64::from(crate::spec::GVISOR_MEMORY_ALLOWANCE_MB),
            };
        let reserved = Reserved {
            memory_mb: memory,
            cpu_millis: u64::from(limits.cpu_millis),
        };
        let creating = self.creating_memory.fetch_add(memory, Ordering::AcqRel);
        let _memory = ReleaseMemory(&self.creating_memory, memory);
        let creating_cpu = self
            .creating_cpu
            .fetch_add(reserved.cpu_millis, Ordering::AcqRel);
        let _cpu = ReleaseMemory(&self.creating_cpu, reserved.cpu_millis);
        if self.reserved_memory_mb() + creating + memory > self.allocatable_memory_mb
            || self.reserved_cpu_millis() + creating_cpu + reserved.cpu_millis
                > self.allocatable_cpu_millis
        {
            return Err(NodeError::AtCapacity);
        }
        let volumes = self.volumes_for(&request.mounts, request.team_id)?;
        let started = self.start_for(&request, limits, volumes).await;
        match &started {
            Err(NodeError::Internal(_)) => self.health.failed(),
            Ok(_) => self.health.succeeded(),
            Err(_) => {}
        }
        let sandbox = started?;
        self.host(request, sandbox, reserved).await
    }

    /// Starts the sandbox: from the warm pool, or a new one (with its volumes).
    async fn start_for(
        &self,
        request: &CreateSandbox,
        limits: Limits,
        volumes: Vec<(String, String, bool)>,
    ) -> Result<Sandbox, NodeError> {
        if volumes.is_empty() && request.isolation == Isolation::Runc {
            return self.start_sandbox(&request.template, limits).await;
        }
        // Mounts are fixed at start: no warm sandbox has them (nor is any warm sandbox
        // under gVisor).
        if !self
            .runtime
            .containerd()
            .template_exists(&request.template)
            .await?
        {
            return Err(NodeError::TemplateNotFound(request.template.clone()));
        }
        Ok(self
            .runtime
            .create_with_volumes(&request.template, limits, volumes, request.isolation)
            .await?)
    }

    /// Makes a started sandbox the gateway's: its link, environment, CA and working
    /// directory; the team's time starts now (a warm sandbox's wait is not theirs).
    async fn host(
        &self,
        mut request: CreateSandbox,
        sandbox: Sandbox,
        reserved: Reserved,
    ) -> Result<(), NodeError> {
        let pid = self
            .runtime
            .containerd()
            .task_pid(&sandbox.id)
            .await
            .map_err(|error| {
                tracing::warn!(error = format!("{error:#}"), "no pid: CPU time unmetered")
            })
            .ok();
        let mut env = std::mem::take(&mut request.env);
        let link = match self.link(&mut request, &sandbox, pid).await {
            Ok(link) => link,
            Err(error) => {
                let _ = self.runtime.destroy(&sandbox.id).await;
                return Err(error);
            }
        };
        if let (Some(attached), Some(network)) = (&link, &self.network) {
            env.extend(attached.env(network.proxy_port()));
        }
        if let (Isolation::Gvisor, Some(pid)) = (request.isolation, pid) {
            crate::namespace::loopback_up(pid).await;
        }
        let hosted = Arc::new(Hosted {
            meter: crate::usage::Meter::start(pid),
            netns: pid.and_then(crate::namespace::open),
            link,
            id: request.id,
            agent: AgentClient::new(sandbox.socket.clone()),
            sandbox,
            template: request.template,
            env,
            cwd: request.cwd,
            processes: Mutex::new(HashMap::new()),
            tracked: Mutex::new(HashMap::new()),
            code_contexts: tokio::sync::Mutex::new(HashMap::new()),
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            terminals: Mutex::new(HashMap::new()),
            output_budget: OutputBudget::new(
                Retained::new(SANDBOX_OUTPUT_BUDGET),
                Arc::clone(&self.output),
            ),
            memory_mb: reserved.memory_mb,
            cpu_millis: reserved.cpu_millis,
            pause: crate::pause_state::PauseState::new(
                request
                    .auto_pause_after_idle_secs
                    .map(std::time::Duration::from_secs),
            ),
        });
        if let Some(link) = &hosted.link
            && let Err(error) = link.install_ca(&hosted.agent).await
        {
            self.undo_create(&hosted).await;
            return Err(NodeError::Internal(
                error.context("installing the sandbox's CA"),
            ));
        }
        if hosted.cwd != WORK_DIR {
            let made = hosted
                .agent
                .simple(&sandbase_agent::protocol::Request::Mkdir {
                    path: hosted.cwd.clone(),
                    owner: Some(user()),
                })
                .await;
            if let Err(error) = made {
                self.undo_create(&hosted).await;
                return Err(error.into());
            }
        }
        self.write().insert(hosted.id, hosted);
        Ok(())
    }

    /// The sandbox's link to the egress proxy, when it asked for egress (its credentials
    /// handed to the proxy, out of the request).
    async fn link(
        &self,
        request: &mut CreateSandbox,
        sandbox: &Sandbox,
        pid: Option<u32>,
    ) -> Result<Option<crate::network::Attached>, NodeError> {
        let Some(policy) = &request.egress else {
            return Ok(None);
        };
        let Some(network) = &self.network else {
            return Err(NodeError::Invalid(
                "this worker has no egress network (sandbase worker --egress-pool)".to_owned(),
            ));
        };
        let policy = sandbase_egress::Policy::parse(&policy.allow, &policy.deny)
            .map_err(|why| NodeError::Invalid(format!("`egress`: {why}")))?;
        let pid = pid.ok_or_else(|| {
            NodeError::Internal(anyhow::anyhow!("the sandbox {} has no pid", sandbox.id))
        })?;
        let store = request
            .store_token
            .take()
            .map(|token| sandbase_egress::process::StoreToken(zeroize::Zeroizing::new(token.0)));
        network
            .attach(
                request.id,
                pid,
                policy,
                std::mem::take(&mut request.credentials),
                store,
            )
            .await
            .map(Some)
            .map_err(NodeError::Internal)
    }

    /// The volumes this node offers, as the gateway sees them.
    pub fn volume_infos(&self) -> Vec<sandbase_api::internal::VolumeInfo> {
        crate::volumes::infos(&self.config.volumes)
    }

    fn volumes_for(
        &self,
        mounts: &[sandbase_api::sandboxes::Mount],
        team: Option<Uuid>,
    ) -> Result<Vec<(String, String, bool)>, NodeError> {
        crate::volumes::resolve(&self.config.volumes, mounts, team)
    }

    async fn start_sandbox(&self, template: &str, limits: Limits) -> Result<Sandbox, NodeError> {
        let defaults = self.config.default_limits;
        if let Some(pool) = self.pools.get(template)
            && limits.disk_mb == defaults.disk_mb
        {
            // Disk size is fixed at start; cpu, memory and pids can change on a claimed one.
            let sandbox = pool.claim().await?;
            if limits == defaults {
                return Ok(sandbox);
            }
            match self
                .runtime
                .containerd()
                .update_limits(&sandbox.id, limits, crate::gvisor::Isolation::Runc)
                .await
            {
                Ok(()) => return Ok(sandbox),
                Err(error) => {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "resizing a warm sandbox failed; starting one"
                    );
                    self.runtime.destroy(&sandbox.id).await?;
                }
            }
        }
        if !self.runtime.containerd().template_exists(template).await? {
            return Err(NodeError::TemplateNotFound(template.to_owned()));
        }
        Ok(self.runtime.create(template, limits).await?)
    }

    /// Undoes a sandbox whose creation failed after it got its link.
    async fn undo_create(&self, hosted: &Hosted) {
        if let (Some(network), Some(link)) = (&self.network, &hosted.link) {
            network.detach(link).await;
        }
        let _ = self.runtime.destroy(&hosted.sandbox.id).await;
    }

    /// Destroys a hosted sandbox; unknown ids are not an error (destroy is idempotent).
    pub async fn destroy(&self, id: Uuid) -> anyhow::Result<bool> {
        let Some(hosted) = self.write().remove(&id) else {
            return Ok(false);
        };
        // The last sample, before the cgroup goes.
        self.usage.push(hosted.meter.sample(id, true));
        hosted.lock_processes().clear();
        if let (Some(network), Some(link)) = (&self.network, &hosted.link) {
            network.detach(link).await;
        }
        self.thaw_for_destroy(&hosted).await;
        self.runtime.destroy(&hosted.sandbox.id).await?;
        Ok(true)
    }

    /// The node's egress network, when it has one.
    pub fn network(&self) -> Option<&Arc<crate::network::Network>> {
        self.network.as_ref()
    }

    /// Usage samples waiting for the gateway.
    pub fn usage(&self) -> &crate::usage::Outbox {
        &self.usage
    }

    pub fn set_recording_sink(&self, sink: crate::recording::RecordingSink) {
        let _ = self.recordings.set(Arc::new(sink));
    }

    pub fn recording_sink(&self) -> Option<Arc<crate::recording::RecordingSink>> {
        self.recordings.get().cloned()
    }

    /// Every hosted sandbox.
    pub(crate) fn hosted_all(&self) -> Vec<Arc<Hosted>> {
        self.read().values().cloned().collect()
    }

    /// Takes a sample of every hosted sandbox into the outbox.
    pub fn sample_all(&self) {
        for sandbox in self.hosted_all() {
            self.usage.push(sandbox.meter.sample(sandbox.id, false));
        }
        if self.usage.has_room_for_events() {
            for event in self.previews.take_usage() {
                self.usage.push_event(event);
            }
        }
        if let Some(network) = &self.network {
            // Back-pressure: while the gateway is away and the outbox is full, egress bytes
            // keep adding up in the network's per-sandbox counters instead.
            if self.usage.has_room_for_events() {
                for event in network.take_usage() {
                    self.usage.push_event(event);
                }
            }
            for event in network.take_audit() {
                self.usage.push_audit(event);
            }
        }
    }

    /// Destroys every hosted sandbox and the warm pools (worker shutdown).
    pub async fn shut_down(&self) {
        for pool in self.pools.values() {
            if let Err(error) = pool.close().await {
                tracing::warn!(error = format!("{error:#}"), "closing a warm pool");
            }
        }
        for id in self.ids() {
            if let Err(error) = self.destroy(id).await {
                tracing::warn!(%id, error = format!("{error:#}"), "destroying a sandbox");
            }
        }
    }

    /// Builds template `name` with `populate` (which fills its root file system, on a
    /// blocking thread); refuses a name that exists.
    pub async fn add_template(
        &self,
        name: &str,
        populate: impl FnOnce(&std::path::Path, u32) -> anyhow::Result<()> + Send,
    ) -> Result<(), NodeError> {
        if self.runtime.containerd().template_exists(name).await? {
            return Err(NodeError::TemplateExists(name.to_owned()));
        }
        let base = self.runtime.config().id_base;
        let built = self
            .runtime
            .containerd()
            .build_template(name, move |rootfs| {
                tokio::task::block_in_place(|| populate(rootfs, base))
                    .map_err(|error| anyhow::Error::new(BadImage(format!("{error:#}"))))
            })
            .await;
        match built {
            Ok(()) => Ok(()),
            Err(error) => match error.downcast_ref::<BadImage>() {
                Some(BadImage(message)) => Err(NodeError::Invalid(format!(
                    "the image cannot be used: {message}"
                ))),
                None => Err(error.into()),
            },
        }
    }

    /// Removes a template (refused while sandboxes started from it exist).
    pub async fn remove_template(&self, name: &str) -> Result<(), NodeError> {
        if !self.runtime.containerd().template_exists(name).await? {
            return Err(NodeError::TemplateNotFound(name.to_owned()));
        }
        if let Some(pool) = self.pools.get(name) {
            pool.close().await?;
        }
        self.runtime
            .containerd()
            .remove_template(name)
            .await
            .map_err(|error| NodeError::Invalid(format!("the template is in use: {error:#}")))
    }

    /// Stops the warm pools' refilling and leaves every sandbox running (a crash).
    pub fn abandon(&self) {
        for pool in self.pools.values() {
            pool.stop_refilling();
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Uuid, Arc<Hosted>>> {
        self.hosted
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Uuid, Arc<Hosted>>> {
        self.hosted
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn process_output_limit(&self) -> usize {
        self.config.process_output_limit
    }

    /// Bytes of background output the worker keeps, all sandboxes together.
    pub fn retained_output(&self) -> usize {
        self.output.bytes()
    }

    /// Memory (MiB) the hosted sandboxes reserve.
    pub fn reserved_memory_mb(&self) -> u64 {
        self.read().values().map(|hosted| hosted.memory_mb).sum()
    }

    /// Memory (MiB) sandboxes may reserve in all (overcommit included).
    pub fn allocatable_memory_mb(&self) -> u64 {
        self.allocatable_memory_mb
    }

    /// CPU (millicores) the hosted sandboxes reserve, and may reserve in all.
    pub fn reserved_cpu_millis(&self) -> u64 {
        self.read().values().map(|hosted| hosted.cpu_millis).sum()
    }

    pub fn allocatable_cpu_millis(&self) -> u64 {
        self.allocatable_cpu_millis
    }

    /// Whether the gateway should place sandboxes here (creates are not failing).
    pub fn healthy(&self) -> bool {
        self.health.healthy()
    }
}

/// What a hosted sandbox holds of its node.
#[derive(Debug, Clone, Copy)]
struct Reserved {
    memory_mb: u64,
    cpu_millis: u64,
}

/// Gives back what a create in progress counted (memory or CPU) when it ends.
struct ReleaseMemory<'a>(&'a AtomicU64, u64);

impl Drop for ReleaseMemory<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

/// What was wrong with an image's content (as opposed to the worker failing).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadImage(String);

struct Release<'a>(&'a AtomicUsize);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pub fn limits_of(resources: Resources) -> Limits {
    Limits {
        cpu_millis: resources.cpu_millis,
        memory_mb: resources.memory_mb,
        disk_mb: resources.disk_mb,
        pids: resources.pids,
    }
}
