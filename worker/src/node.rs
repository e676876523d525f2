//! The node: the sandboxes this worker hosts for the gateway, keyed by the gateway's ids,
//! with their warm pools, capacity, defaults and background processes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use chrono::{DateTime, Utc};
use sandbase_agent::protocol::{ExecRequest, ExitInfo, Owner};
use sandbase_api::internal::{CreateSandbox, Exec, TemplateInfo};
use sandbase_api::sandboxes::{Process, Resources, RunAs};
use uuid::Uuid;

use crate::agent_client::{AgentClient, ExecEvent, Refused, Stdin};
use crate::pool::WarmPool;
use crate::sandboxes::{Sandbox, Worker};
use crate::spec::{Limits, SANDBOX_USER, WORK_DIR};

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
    /// Host directories sandboxes may ask to mount, by name: (host path, writable).
    pub volumes: BTreeMap<String, (std::path::PathBuf, bool)>,
    /// Egress through the node's proxy; without it sandboxes have loopback only.
    pub egress: Option<crate::network::EgressConfig>,
}

pub struct Node {
    worker: Arc<Worker>,
    config: NodeConfig,
    pools: HashMap<String, Arc<WarmPool>>,
    hosted: RwLock<HashMap<Uuid, Arc<Hosted>>>,
    /// Creates in progress, counted against capacity.
    creating: AtomicUsize,
    /// Usage samples waiting for the gateway.
    usage: crate::usage::Outbox,
    network: Option<Arc<crate::network::Network>>,
}

/// A sandbox hosted for the gateway.
pub struct Hosted {
    pub id: Uuid,
    pub sandbox: Sandbox,
    pub agent: AgentClient,
    pub template: String,
    env: BTreeMap<String, String>,
    cwd: String,
    processes: Mutex<HashMap<u32, Arc<Background>>>,
    meter: crate::usage::Meter,
    /// Its link to the egress proxy, when it has egress.
    pub link: Option<crate::network::Attached>,
}

/// A command started in the background: its output so far, its exit, its open stdin.
pub struct Background {
    pub pid: u32,
    pub argv: Vec<String>,
    pub started_at: DateTime<Utc>,
    state: Mutex<BackgroundState>,
    stdin: tokio::sync::Mutex<Option<Stdin>>,
}

#[derive(Default)]
struct BackgroundState {
    stdout: VecDeque<u8>,
    stderr: VecDeque<u8>,
    exit: Option<ExitInfo>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("no such sandbox on this worker")]
    SandboxNotFound,
    #[error("no such process in this sandbox")]
    ProcessNotFound,
    #[error("this worker is at capacity")]
    AtCapacity,
    #[error("template `{0}` is not on this worker")]
    TemplateNotFound(String),
    #[error("a sandbox with this id already exists")]
    Exists,
    #[error("template `{0}` exists already on this worker")]
    TemplateExists(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    Internal(anyhow::Error),
}

impl From<anyhow::Error> for NodeError {
    fn from(error: anyhow::Error) -> Self {
        match error.downcast::<Refused>() {
            Ok(refused) => NodeError::Refused(refused),
            Err(error) => NodeError::Internal(error),
        }
    }
}

/// The default search path of commands.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Node {
    /// Starts the warm pools; the worker has already removed what a predecessor left.
    pub fn start(
        worker: Arc<Worker>,
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
                    WarmPool::start(Arc::clone(&worker), template, config.default_limits, *size),
                )
            })
            .collect();
        Arc::new(Node {
            worker,
            config,
            pools,
            hosted: RwLock::new(HashMap::new()),
            creating: AtomicUsize::new(0),
            usage: crate::usage::Outbox::default(),
            network,
        })
    }

    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
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
            .worker
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
    pub async fn create(&self, mut request: CreateSandbox) -> Result<(), NodeError> {
        if self.read().contains_key(&request.id) {
            return Err(NodeError::Exists);
        }
        let in_progress = self.creating.fetch_add(1, Ordering::AcqRel);
        let _release = Release(&self.creating);
        if self.read().len() + in_progress >= self.config.capacity {
            return Err(NodeError::AtCapacity);
        }
        let limits = limits_of(request.resources);
        let volumes = self.volumes_for(&request.mounts)?;
        let sandbox = if volumes.is_empty() {
            self.start_sandbox(&request.template, limits).await?
        } else {
            // Mounts are fixed at start: no warm sandbox has them.
            if !self
                .worker
                .containerd()
                .template_exists(&request.template)
                .await?
            {
                return Err(NodeError::TemplateNotFound(request.template));
            }
            self.worker
                .create_with_volumes(&request.template, limits, volumes)
                .await?
        };
        // The team's time starts now (a warm sandbox's wait is not theirs).
        let pid = self
            .worker
            .containerd()
            .task_pid(&sandbox.id)
            .await
            .map_err(|error| {
                tracing::warn!(error = format!("{error:#}"), "no pid: CPU time unmetered")
            })
            .ok();
        let mut env = request.env;
        let link = match (&request.egress, &self.network) {
            (None, _) => None,
            (Some(_), None) => {
                let _ = self.worker.destroy(&sandbox.id).await;
                return Err(NodeError::Invalid(
                    "this worker has no egress network (sandbase worker --egress-pool)".to_owned(),
                ));
            }
            (Some(policy), Some(network)) => {
                let attached = async {
                    let policy = sandbase_egress::Policy::parse(&policy.allow, &policy.deny)
                        .map_err(|why| NodeError::Invalid(format!("`egress`: {why}")))?;
                    let pid = pid.ok_or_else(|| {
                        NodeError::Internal(anyhow::anyhow!("the sandbox has no pid"))
                    })?;
                    network
                        .attach(
                            request.id,
                            pid,
                            policy,
                            std::mem::take(&mut request.credentials),
                        )
                        .await
                        .map_err(NodeError::Internal)
                }
                .await;
                match attached {
                    Ok(attached) => {
                        env.extend(attached.env(network.proxy_port()));
                        Some(attached)
                    }
                    Err(error) => {
                        let _ = self.worker.destroy(&sandbox.id).await;
                        return Err(error);
                    }
                }
            }
        };
        let hosted = Arc::new(Hosted {
            meter: crate::usage::Meter::start(pid),
            link,
            id: request.id,
            agent: AgentClient::new(sandbox.socket.clone()),
            sandbox,
            template: request.template,
            env,
            cwd: request.cwd,
            processes: Mutex::new(HashMap::new()),
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

    /// The volumes this node offers, as the gateway sees them.
    pub fn volume_infos(&self) -> Vec<sandbase_api::internal::VolumeInfo> {
        self.config
            .volumes
            .iter()
            .map(|(name, (_, writable))| sandbase_api::internal::VolumeInfo {
                name: name.clone(),
                writable: *writable,
            })
            .collect()
    }

    /// Resolves requested mounts to host directories, refusing unknown volumes, writable
    /// mounts of read-only volumes, and places the sandbox needs for itself.
    fn volumes_for(
        &self,
        mounts: &[sandbase_api::sandboxes::Mount],
    ) -> Result<Vec<(String, String, bool)>, NodeError> {
        let mut resolved = Vec::new();
        for mount in mounts {
            let Some((host, writable)) = self.config.volumes.get(&mount.volume) else {
                return Err(NodeError::Invalid(format!(
                    "no volume `{}` on this worker",
                    mount.volume
                )));
            };
            if !mount.read_only && !writable {
                return Err(NodeError::Invalid(format!(
                    "volume `{}` is read-only",
                    mount.volume
                )));
            }
            if let Some(reason) = reserved_mount_path(&mount.path) {
                return Err(NodeError::Invalid(reason));
            }
            let host = host
                .to_str()
                .ok_or_else(|| NodeError::Invalid("a volume path is not UTF-8".to_owned()))?;
            resolved.push((host.to_owned(), mount.path.clone(), mount.read_only));
        }
        Ok(resolved)
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
                .worker
                .containerd()
                .update_limits(&sandbox.id, limits)
                .await
            {
                Ok(()) => return Ok(sandbox),
                Err(error) => {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "resizing a warm sandbox failed; starting one"
                    );
                    self.worker.destroy(&sandbox.id).await?;
                }
            }
        }
        if !self.worker.containerd().template_exists(template).await? {
            return Err(NodeError::TemplateNotFound(template.to_owned()));
        }
        Ok(self.worker.create(template, limits).await?)
    }

    /// Undoes a sandbox whose creation failed after it got its link.
    async fn undo_create(&self, hosted: &Hosted) {
        if let (Some(network), Some(link)) = (&self.network, &hosted.link) {
            network.detach(link).await;
        }
        let _ = self.worker.destroy(&hosted.sandbox.id).await;
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
        self.worker.destroy(&hosted.sandbox.id).await?;
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

    /// Takes a sample of every hosted sandbox into the outbox.
    pub fn sample_all(&self) {
        let hosted: Vec<Arc<Hosted>> = self.read().values().cloned().collect();
        for sandbox in hosted {
            self.usage.push(sandbox.meter.sample(sandbox.id, false));
        }
        if let Some(network) = &self.network {
            for event in network.take_usage() {
                self.usage.push_event(event);
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
        if self.worker.containerd().template_exists(name).await? {
            return Err(NodeError::TemplateExists(name.to_owned()));
        }
        let base = self.worker.config().id_base;
        let built = self
            .worker
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
        if !self.worker.containerd().template_exists(name).await? {
            return Err(NodeError::TemplateNotFound(name.to_owned()));
        }
        if let Some(pool) = self.pools.get(name) {
            pool.close().await?;
        }
        self.worker
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

pub fn limits_of(resources: Resources) -> Limits {
    Limits {
        cpu_millis: resources.cpu_millis,
        memory_mb: resources.memory_mb,
        disk_mb: resources.disk_mb,
        pids: resources.pids,
    }
}

fn user() -> Owner {
    Owner {
        uid: SANDBOX_USER,
        gid: SANDBOX_USER,
    }
}

impl Hosted {
    /// The agent request for `exec`: the sandbox's environment and working directory under
    /// the command's own, as the sandbox user unless root was asked for.
    pub fn exec_request(&self, exec: &Exec) -> Result<ExecRequest, NodeError> {
        if exec.argv.is_empty() {
            return Err(NodeError::Invalid("the command is empty".to_owned()));
        }
        let (user, home, name) = match exec.user {
            RunAs::User => (Some(user()), WORK_DIR, "user"),
            RunAs::Root => (None, "/root", "root"),
        };
        let mut env: BTreeMap<String, String> = [
            ("PATH", PATH),
            ("HOME", home),
            ("USER", name),
            ("LANG", "C.UTF-8"),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
        env.extend(self.env.clone());
        env.extend(exec.env.clone());
        Ok(ExecRequest {
            argv: exec.argv.clone(),
            env,
            cwd: Some(exec.cwd.clone().unwrap_or_else(|| self.cwd.clone())),
            user,
            timeout_ms: exec.timeout_ms,
            stdin: false,
        })
    }

    /// Starts `exec` in the background with its standard input open.
    pub async fn start_background(
        self: &Arc<Self>,
        exec: &Exec,
        output_limit: usize,
    ) -> Result<u32, NodeError> {
        let request = self.exec_request(exec)?;
        let initial = exec.stdin.clone().map(String::into_bytes);
        let (mut events, stdin) = self.agent.start(request, initial, true).await?;
        let pid = match events.recv().await {
            Some(Ok(ExecEvent::Started { pid })) => pid,
            Some(Err(error)) => return Err(error.into()),
            other => {
                return Err(NodeError::Internal(anyhow::anyhow!(
                    "unexpected first event {other:?}"
                )));
            }
        };
        let process = Arc::new(Background {
            pid,
            argv: exec.argv.clone(),
            started_at: Utc::now(),
            state: Mutex::new(BackgroundState::default()),
            stdin: tokio::sync::Mutex::new(stdin),
        });
        self.lock_processes().insert(pid, Arc::clone(&process));
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let mut state = process.lock();
                match event {
                    Ok(ExecEvent::Stdout(bytes)) => {
                        keep_tail(&mut state.stdout, &bytes, output_limit)
                    }
                    Ok(ExecEvent::Stderr(bytes)) => {
                        keep_tail(&mut state.stderr, &bytes, output_limit)
                    }
                    Ok(ExecEvent::Exit(exit)) => state.exit = Some(exit),
                    Ok(ExecEvent::Started { .. }) => {}
                    Err(error) => {
                        tracing::debug!(
                            error = format!("{error:#}"),
                            "background process stream ended"
                        );
                        state.exit.get_or_insert(ExitInfo {
                            code: -1,
                            signal: None,
                            timed_out: false,
                            duration_ms: 0,
                        });
                    }
                }
            }
            // The command is over: close its input.
            process.stdin.lock().await.take();
        });
        Ok(pid)
    }

    pub fn process(&self, pid: u32) -> Result<Arc<Background>, NodeError> {
        self.lock_processes()
            .get(&pid)
            .cloned()
            .ok_or(NodeError::ProcessNotFound)
    }

    pub fn processes(&self) -> Vec<Arc<Background>> {
        let mut processes: Vec<_> = self.lock_processes().values().cloned().collect();
        processes.sort_by_key(|process| process.started_at);
        processes
    }

    fn lock_processes(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Background>>> {
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Background {
    /// The process as the API shows it, with its output when `with_output`.
    pub fn describe(&self, with_output: bool) -> Process {
        let state = self.lock();
        let text = |bytes: &VecDeque<u8>| {
            if with_output {
                let (front, back) = bytes.as_slices();
                let mut joined = Vec::with_capacity(bytes.len());
                joined.extend_from_slice(front);
                joined.extend_from_slice(back);
                String::from_utf8_lossy(&joined).into_owned()
            } else {
                String::new()
            }
        };
        Process {
            pid: self.pid,
            cmd: self.argv.clone(),
            running: state.exit.is_none(),
            exit_code: state.exit.map(|exit| exit.code),
            started_at: self.started_at,
            stdout: text(&state.stdout),
            stderr: text(&state.stderr),
        }
    }

    pub fn running(&self) -> bool {
        self.lock().exit.is_none()
    }

    /// Writes to the process's standard input; `close` ends it afterwards.
    pub async fn send_stdin(&self, bytes: &[u8], close: bool) -> Result<(), NodeError> {
        let mut stdin = self.stdin.lock().await;
        let Some(open) = stdin.as_mut() else {
            return Err(NodeError::Invalid(
                "the process's standard input is closed".to_owned(),
            ));
        };
        if !bytes.is_empty() {
            open.write(bytes).await?;
        }
        if close && let Some(open) = stdin.take() {
            open.close().await?;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BackgroundState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Appends `bytes`, dropping the oldest so at most `limit` remain.
fn keep_tail(buffer: &mut VecDeque<u8>, bytes: &[u8], limit: usize) {
    buffer.extend(bytes);
    let excess = buffer.len().saturating_sub(limit);
    buffer.drain(..excess);
}
