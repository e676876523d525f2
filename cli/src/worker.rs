//! `sandbase worker`: runs sandboxes on this node for a gateway.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sandbase_worker::node::{NodeConfig, Volume};
use sandbase_worker::runtime::RuntimeConfig;
use sandbase_worker::service::{self, ServiceConfig, TemplateSource};
use sandbase_worker::spec::Limits;

/// Where `scripts/setup` leaves template root file systems (`NAME.tar`).
pub const TEMPLATES_DIR: &str = "/var/lib/sandbase/templates";

#[derive(Args, Clone)]
pub struct WorkerArgs {
    /// The gateway this worker serves.
    #[arg(long, env = "SANDBASE_GATEWAY_URL")]
    pub gateway: String,
    /// This worker's credential (`sandbase admin worker-credential --worker-id ID` prints
    /// it); it names the worker, so `--worker-id` may be left out.
    #[arg(
        long,
        env = "SANDBASE_WORKER_CREDENTIAL",
        hide_env_values = true,
        required_unless_present = "credential_file"
    )]
    pub credential: Option<String>,
    /// Or a file holding it (a mounted secret; one trailing newline ignored).
    #[arg(
        long,
        env = "SANDBASE_WORKER_CREDENTIAL_FILE",
        conflicts_with = "credential"
    )]
    pub credential_file: Option<PathBuf>,
    /// TLS of the internal channel: the operator's CA (PEM), which the gateway's certificate
    /// must chain to; with `--tls-cert` and `--tls-key`, this worker serves its API over
    /// https with them. The gateway then sends it credentials.
    #[arg(long, env = "SANDBASE_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    #[arg(long, env = "SANDBASE_TLS_CERT", requires = "tls_ca")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, env = "SANDBASE_TLS_KEY", requires = "tls_ca")]
    pub tls_key: Option<PathBuf>,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// Settings of the node itself, shared with `sandbase dev`.
#[derive(Args, Clone)]
pub struct NodeArgs {
    /// Address of the worker's internal API (the gateway calls it).
    #[arg(long = "worker-listen", value_parser = crate::args::parse_listen, default_value = "127.0.0.1:8090")]
    pub worker_listen: SocketAddr,
    /// URL the gateway uses to reach this worker (default: http://<worker-listen>).
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// This worker's name (default: the one its credential names, else the host name).
    #[arg(long = "worker-id", env = "SANDBASE_WORKER_ID")]
    pub worker_id: Option<String>,
    /// containerd's socket.
    #[arg(
        long,
        env = "SANDBASE_CONTAINERD_SOCKET",
        default_value = "/run/sandbase/containerd.sock"
    )]
    pub containerd_socket: PathBuf,
    /// containerd namespace of this worker's containers and templates.
    #[arg(long, default_value = "sandbase")]
    pub namespace: String,
    /// The statically linked sandbox agent (default: `sandbase-agent` next to this binary).
    #[arg(long, env = "SANDBASE_AGENT_BINARY")]
    pub agent: Option<PathBuf>,
    /// Directory of the sandboxes' control sockets.
    #[arg(long, default_value = "/run/sandbase/sandboxes")]
    pub run_dir: PathBuf,
    /// First host uid/gid of the 65536 ids sandboxes map to.
    #[arg(long, default_value_t = 1_000_000)]
    pub id_base: u32,
    /// Most sandboxes at once.
    #[arg(long, default_value_t = 100)]
    pub capacity: usize,
    /// Memory sandboxes may reserve in all, in MiB (0: the machine's memory less 1 GiB for
    /// the node itself).
    #[arg(long, default_value_t = 0)]
    pub memory_mb: u64,
    /// How far memory reservations may exceed `--memory-mb` (1.0: not at all).
    #[arg(long, default_value_t = 1.0)]
    pub memory_overcommit: f64,
    /// CPU sandboxes may reserve in all, in thousandths of a core (0: the machine's cores).
    #[arg(long, default_value_t = 0)]
    pub cpu_millis: u64,
    /// How far CPU reservations may exceed `--cpu-millis` (CPU is shared: idle sandboxes
    /// leave theirs to busy ones).
    #[arg(long, default_value_t = 8.0)]
    pub cpu_overcommit: f64,
    /// Warm pool: TEMPLATE=SIZE (repeatable).
    #[arg(long = "pool", value_parser = parse_pool, default_values = ["base=2"])]
    pub pools: Vec<(String, usize)>,
    /// A host directory sandboxes may mount: NAME=PATH (read-only for every team), or
    /// NAME=PATH:rw=TEAM_ID[,TEAM_ID…] (writable for the teams named, read-only for the
    /// rest) (repeatable). Nothing else of the host is ever mounted.
    #[arg(long = "volume", value_parser = parse_volume)]
    pub volumes: Vec<(String, Volume)>,
    /// gVisor's runsc, for sandboxes asking for `isolation: gvisor`: a path, `auto` (runsc on
    /// the PATH, when installed) or `none`.
    #[arg(long, default_value = "auto")]
    pub runsc: String,
    /// The /16 sandboxes with egress take their addresses from (a /30 each); `none` turns
    /// egress off (sandboxes then have loopback only).
    #[arg(long = "egress-pool", default_value = "10.213.0.0")]
    pub egress_pool: String,
    /// The egress proxy's port on the sandboxes' host-side addresses; the next two take
    /// redirected ports 80 and 443.
    #[arg(long = "egress-proxy-port", default_value_t = 3128)]
    pub egress_proxy_port: u16,
    /// Certificates (PEM) trusted for upstreams of intercepted connections besides the
    /// system's roots (an internal CA).
    #[arg(long = "egress-extra-ca")]
    pub egress_extra_ca: Option<std::path::PathBuf>,
    /// A network sandboxes may never reach through the proxy, on top of internal ones:
    /// the fleet's NAT and public addresses (repeatable; `198.51.100.0/24`).
    #[arg(long = "egress-deny", value_parser = sandbase_egress::ssrf::Cidr::parse)]
    pub egress_deny: Vec<sandbase_egress::ssrf::Cidr>,
    /// A name the egress proxy resolves to these addresses before asking the system's
    /// resolver: NAME=IP[,IP…] (repeatable; split-horizon names, or an upstream of a test).
    /// The addresses still pass the SSRF guard, and sandboxes still reach only the names
    /// their policy allows.
    #[arg(long = "egress-resolve", value_parser = parse_pinned_name)]
    pub egress_resolve: Vec<(String, Vec<std::net::IpAddr>)>,
    /// Directory of template tarballs (`NAME.tar`) built into templates when missing.
    #[arg(long, default_value = TEMPLATES_DIR)]
    pub templates_dir: PathBuf,
    /// Size of warm sandboxes (the gateway's `sandboxes.default_resources`).
    #[arg(long, default_value_t = 1000)]
    pub default_cpu_millis: u32,
    #[arg(long, default_value_t = 512)]
    pub default_memory_mb: u32,
    #[arg(long, default_value_t = 1024)]
    pub default_disk_mb: u32,
    #[arg(long, default_value_t = 256)]
    pub default_pids: u32,
}

fn parse_volume(value: &str) -> Result<(String, Volume), String> {
    let (name, rest) = value
        .split_once('=')
        .ok_or_else(|| format!("`{value}` is not NAME=PATH[:rw=TEAM_ID,…]"))?;
    let (path, writers) = match rest.split_once(":rw") {
        Some((path, teams)) => {
            let teams = teams.strip_prefix('=').ok_or_else(|| {
                format!(
                    "volume `{name}`: a writable volume names the teams that may write it \
                     (NAME=PATH:rw=TEAM_ID[,TEAM_ID…])"
                )
            })?;
            let writers = teams
                .split(',')
                .map(|team| {
                    team.trim()
                        .parse::<uuid::Uuid>()
                        .map_err(|_| format!("volume `{name}`: `{team}` is not a team id"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            (path, writers)
        }
        None => (rest.strip_suffix(":ro").unwrap_or(rest), Vec::new()),
    };
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(format!(
            "volume `{name}`: `{}` is not an absolute path",
            path.display()
        ));
    }
    Ok((name.to_owned(), Volume { path, writers }))
}

fn parse_pinned_name(value: &str) -> Result<(String, Vec<std::net::IpAddr>), String> {
    let (name, addresses) = value
        .split_once('=')
        .ok_or_else(|| format!("`{value}` is not NAME=IP[,IP…]"))?;
    let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() > 253 || !name.split('.').all(valid_label) {
        return Err(format!("`{name}` is not a host name"));
    }
    let addresses = addresses
        .split(',')
        .map(|address| {
            address
                .trim()
                .parse()
                .map_err(|_| format!("`{address}` is not an IP address"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name, addresses))
}

fn parse_pool(value: &str) -> Result<(String, usize), String> {
    let (template, size) = value
        .split_once('=')
        .ok_or_else(|| format!("`{value}` is not TEMPLATE=SIZE"))?;
    let size = size
        .parse()
        .map_err(|_| format!("`{size}` is not a pool size"))?;
    Ok((template.to_owned(), size))
}

impl NodeArgs {
    /// The runsc this node offers gVisor with, if any.
    fn runsc(&self) -> anyhow::Result<Option<PathBuf>> {
        match self.runsc.as_str() {
            "none" => Ok(None),
            "auto" => Ok(sandbase_worker::gvisor::find_runsc()),
            path => {
                let path = PathBuf::from(path);
                anyhow::ensure!(
                    path.is_absolute() && path.is_file(),
                    "--runsc: `{}` is not an absolute path to runsc (or `auto`, `none`)",
                    path.display()
                );
                Ok(Some(path))
            }
        }
    }

    /// This worker's id: `--worker-id`, else the one `credential` names, else the host name.
    pub fn id_for(&self, credential: &str) -> String {
        self.worker_id
            .clone()
            .or_else(|| sandbase_api::internal::credential_worker_id(credential).map(str::to_owned))
            .unwrap_or_else(hostname)
    }

    /// The service configuration for a gateway at `gateway_url`.
    pub fn service_config(
        &self,
        gateway_url: &str,
        credential: &str,
    ) -> anyhow::Result<ServiceConfig> {
        let agent = match &self.agent {
            Some(agent) => agent.clone(),
            None => std::env::current_exe()?
                .parent()
                .map(|dir| dir.join("sandbase-agent"))
                .context("locating sandbase-agent")?,
        };
        anyhow::ensure!(
            agent.is_file(),
            "the sandbox agent {} does not exist: build it statically (scripts/dev does) and pass --agent or SANDBASE_AGENT_BINARY",
            agent.display()
        );
        let mut templates = vec![("busybox".to_owned(), TemplateSource::Busybox)];
        templates.extend(tarball_templates(&self.templates_dir)?);
        Ok(ServiceConfig {
            worker: RuntimeConfig {
                containerd_socket: self.containerd_socket.clone(),
                namespace: self.namespace.clone(),
                agent_binary: agent,
                run_dir: self.run_dir.clone(),
                id_base: self.id_base,
                runsc: self.runsc()?,
            },
            node: NodeConfig {
                capacity: self.capacity,
                pools: self.pools.clone(),
                default_limits: Limits {
                    cpu_millis: self.default_cpu_millis,
                    memory_mb: self.default_memory_mb,
                    disk_mb: self.default_disk_mb,
                    pids: self.default_pids,
                },
                process_output_limit: 1024 * 1024,
                memory_mb: self.memory_mb,
                memory_overcommit: self.memory_overcommit,
                cpu_millis: self.cpu_millis,
                cpu_overcommit: self.cpu_overcommit,
                volumes: self.volumes.iter().cloned().collect(),
                egress: match self.egress_pool.as_str() {
                    "none" => None,
                    pool => Some(sandbase_worker::network::EgressConfig {
                        pool: pool.parse().map_err(|_| {
                            anyhow::anyhow!(
                                "--egress-pool: `{pool}` is not an IPv4 address (or `none`)"
                            )
                        })?,
                        proxy_port: self.egress_proxy_port,
                        resolver: if self.egress_resolve.is_empty() {
                            sandbase_egress::proxy::Resolver::System
                        } else {
                            sandbase_egress::proxy::Resolver::Pinned(
                                self.egress_resolve.iter().cloned().collect(),
                            )
                        },
                        node_addresses: Vec::new(),
                        denied_networks: self.egress_deny.clone(),
                        max_connections: 64,
                        extra_ca: match &self.egress_extra_ca {
                            Some(path) => Some(std::fs::read(path).map_err(|error| {
                                anyhow::anyhow!("--egress-extra-ca {}: {error}", path.display())
                            })?),
                            None => None,
                        },
                        proxy_program: std::env::current_exe()
                            .map_err(|error| anyhow::anyhow!("finding this executable: {error}"))?,
                        proxy_user: Some(sandbase_worker::network::PROXY_USER),
                        restart_delay: Duration::from_secs(1),
                    }),
                },
            },
            listen: self.worker_listen,
            advertise_url: self.advertise_url.clone(),
            gateway_url: gateway_url.to_owned(),
            credential: credential.to_owned(),
            tls: None,
            worker_id: self.id_for(credential),
            heartbeat_interval: Duration::from_secs(2),
            usage_interval: Duration::from_secs(5),
            templates,
        })
    }
}

/// Every `NAME.tar` in `dir`, as template `NAME`.
fn tarball_templates(dir: &Path) -> anyhow::Result<Vec<(String, TemplateSource)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error).with_context(|| format!("reading {}", dir.display())),
    };
    let mut templates = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if let Some(name) = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_suffix(".tar"))
        {
            templates.push((name.to_owned(), TemplateSource::Tarball(path.clone())));
        }
    }
    templates.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(templates)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "worker".to_owned())
}

pub fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::init_with_level("info");
    let credential = match (&args.credential, &args.credential_file) {
        (Some(credential), _) => credential.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map(|text| text.trim_end().to_owned())
            .with_context(|| format!("reading the worker credential from {}", path.display()))?,
        (None, None) => anyhow::bail!("--credential or --credential-file is required"),
    };
    let mut config = args.node.service_config(&args.gateway, &credential)?;
    if let (Some(ca_file), Some(cert_file), Some(key_file)) =
        (&args.tls_ca, &args.tls_cert, &args.tls_key)
    {
        let files = sandbase_egress::channel::ChannelFiles {
            ca_file: ca_file.clone(),
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
            peer_name: None,
        };
        config.tls = Some(
            files
                .load()
                .map_err(|error| anyhow::anyhow!("TLS: {error}"))?,
        );
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let running = service::start(config).await?;
            tracing::info!(address = %running.local_addr(), "worker listening");
            eprintln!("worker listening on {}", running.local_addr());
            crate::signal::shutdown_signal().await;
            tracing::info!("worker stopping: destroying its sandboxes");
            running.stop().await;
            Ok::<(), anyhow::Error>(())
        })?;
    Ok(ExitCode::SUCCESS)
}
