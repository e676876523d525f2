//! Sandbox egress on this node. A sandbox that asks for egress gets a veth pair: one end in
//! its network namespace (a /30 from the node's pool, default route to the other end), the
//! other on the host. nftables (one table owned by SandBase) lets packets from those links
//! reach only the egress proxy's port on the host and drops everything else — other
//! sandboxes, host services, the gateway, the internet directly. The proxy (`sandbase-egress`)
//! identifies a sandbox by its address and applies its policy; commands get `HTTP_PROXY`,
//! `HTTPS_PROXY` and `ALL_PROXY` pointing at it, and tools that ignore them are governed
//! anyway: TCP 80 and 443 from sandbox links are redirected to the proxy's transparent
//! listeners (ports `proxy_port + 1` and `+ 2`). A sandbox given credentials gets its own CA
//! (trusted through `SSL_CERT_FILE` and friends) and placeholders for placeholder
//! credentials; the values stay in memory (this process's and the proxy's). Sandboxes
//! without egress keep a namespace with loopback only.
//!
//! The proxy runs as a process of its own (`sandbase egress-proxy`, not root once it
//! listens), supervised here: this side keeps every sandbox's registration, orders the
//! process about over its standard input, reads its flow records from its standard output,
//! and when it dies starts another after `restart_delay` and registers everything again.
//! Meanwhile sandboxes reach nothing: the firewall still admits them only to the proxy's
//! ports, where nothing listens.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use sandbase_egress::Policy;
use sandbase_egress::credentials::{CredentialSpec, Injection, placeholder_for};
use sandbase_egress::process::{
    Envelope, InterceptionSpec, Order, ProcessConfig, Registration, Report,
};
use sandbase_egress::proxy::{Flow, Resolver};
use sandbase_egress::tls::Authority;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;
use zeroize::Zeroizing;

/// The nftables table SandBase owns.
pub const TABLE: &str = "sandbase";
/// Host-side links are named `sbh<slot>`; the sandbox side `sbs<slot>` before it moves.
const HOST_PREFIX: &str = "sbh";
/// Flow records kept per sandbox.
const FLOWS_KEPT: usize = 1000;

#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// A /16 whose /30s go to sandboxes (e.g. 10.213.0.0).
    pub pool: Ipv4Addr,
    /// The proxy's port on each sandbox's host-side address.
    pub proxy_port: u16,
    /// Names resolved by the proxy: the system's resolver, or an explicit table (tests).
    pub resolver: Resolver,
    /// Addresses of this node that no sandbox may reach through the proxy.
    pub node_addresses: Vec<IpAddr>,
    /// Most connections one sandbox holds open through the proxy.
    pub max_connections: usize,
    /// Certificates (PEM) trusted for upstreams besides the system's roots (tests).
    pub extra_ca: Option<Vec<u8>>,
    /// The `sandbase` executable, run as `PROGRAM egress-proxy`.
    pub proxy_program: PathBuf,
    /// The user and group the proxy becomes once it listens (`nobody`, `nogroup`).
    pub proxy_user: Option<(u32, u32)>,
    /// How long after the proxy process died another one is started.
    pub restart_delay: Duration,
}

/// `nobody` and `nogroup` on Debian and Ubuntu.
pub const PROXY_USER: (u32, u32) = (65_534, 65_534);

/// Where a sandbox with credentials finds its CA: the certificate alone, and the template's
/// bundle with it (in the sandbox's `/tmp`, owned by its root, read-only to commands).
const CA_DIR: &str = "/tmp/.sandbase-ca";
const CA_FILE: &str = "/tmp/.sandbase-ca/ca.pem";
const CA_BUNDLE: &str = "/tmp/.sandbase-ca/bundle.pem";
/// The template's trust store, read to make the bundle.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A sandbox's link.
#[derive(Debug, Clone)]
pub struct Attached {
    slot: u32,
    pub host: Ipv4Addr,
    pub address: Ipv4Addr,
    link: String,
    /// The sandbox's CA certificate (PEM) when it has credentials.
    pub ca_pem: Option<String>,
    /// Placeholder variables of its placeholder credentials.
    pub placeholders: Vec<(String, String)>,
}

impl Attached {
    /// Variables for the sandbox's commands: the proxy, the CA, placeholders.
    pub fn env(&self, proxy_port: u16) -> Vec<(String, String)> {
        let url = format!("http://{}:{proxy_port}", self.host);
        let mut env = Vec::new();
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
            env.push((name.to_owned(), url.clone()));
            env.push((name.to_ascii_lowercase(), url.clone()));
        }
        env.push(("NO_PROXY".to_owned(), "localhost,127.0.0.1".to_owned()));
        env.push(("no_proxy".to_owned(), "localhost,127.0.0.1".to_owned()));
        if self.ca_pem.is_some() {
            for name in [
                "SSL_CERT_FILE",
                "REQUESTS_CA_BUNDLE",
                "CURL_CA_BUNDLE",
                "GIT_SSL_CAINFO",
            ] {
                env.push((name.to_owned(), CA_BUNDLE.to_owned()));
            }
            env.push(("NODE_EXTRA_CA_CERTS".to_owned(), CA_FILE.to_owned()));
        }
        env.extend(self.placeholders.iter().cloned());
        env
    }

    /// Installs the CA in the sandbox: alone and appended to the template's bundle.
    pub async fn install_ca(&self, agent: &crate::agent_client::AgentClient) -> anyhow::Result<()> {
        let Some(ca) = &self.ca_pem else {
            return Ok(());
        };
        let read = sandbase_agent::protocol::Request::ReadFile {
            path: SYSTEM_BUNDLE.to_owned(),
        };
        let mut bundle = match agent.download(&read).await {
            Ok((_, mut chunks)) => {
                let mut bytes = Vec::new();
                while let Some(chunk) = chunks.recv().await {
                    bytes.extend_from_slice(&chunk?);
                }
                bytes
            }
            Err(_) => Vec::new(),
        };
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(ca.as_bytes());
        agent
            .simple(&sandbase_agent::protocol::Request::Mkdir {
                path: CA_DIR.to_owned(),
                owner: None,
            })
            .await?;
        agent
            .write_file(CA_FILE, ca.as_bytes(), Some(0o644), None)
            .await?;
        agent
            .write_file(CA_BUNDLE, &bundle, Some(0o644), None)
            .await?;
        Ok(())
    }
}

/// A credential as the gateway hands it over, made ready for the proxy: its placeholder
/// drawn, its hosts parsed. The value moves into memory that is zeroed on drop.
fn credential(
    given: sandbase_api::internal::SandboxCredential,
) -> anyhow::Result<(CredentialSpec, Option<(String, String)>)> {
    let value = zeroize::Zeroizing::new(given.value);
    let hosts = given
        .hosts
        .iter()
        .map(|host| sandbase_egress::HostPattern::parse(host))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|why| anyhow::anyhow!("credential `{}`: {why}", given.name))?;
    let inject = &given.inject;
    let mut variable = None;
    let injection = if let Some(header) = &inject.header {
        Injection::Header {
            name: header
                .parse()
                .with_context(|| format!("credential `{}`: bad header name", given.name))?,
            format: inject
                .format
                .clone()
                .unwrap_or_else(|| "{value}".to_owned()),
        }
    } else if let Some(basic) = &inject.basic {
        Injection::Basic {
            username: basic.username.clone(),
        }
    } else if let Some(parameter) = &inject.query {
        Injection::Query {
            parameter: parameter.clone(),
        }
    } else if let Some(env) = &inject.placeholder {
        let placeholder = placeholder_for(&value);
        variable = Some((env.clone(), placeholder.clone()));
        Injection::Placeholder {
            env: env.clone(),
            placeholder,
        }
    } else {
        anyhow::bail!("credential `{}` says nothing about injection", given.name);
    };
    Ok((
        CredentialSpec {
            name: given.name,
            hosts,
            injection,
            value,
        },
        variable,
    ))
}

pub struct Network {
    config: EgressConfig,
    /// What the proxy process must know, by sandbox address: sent again to each new one.
    /// Orders are queued while this is locked, so they leave in the order it changed.
    registrations: Arc<Mutex<HashMap<IpAddr, Registration>>>,
    orders: mpsc::UnboundedSender<(Envelope, Option<oneshot::Sender<()>>)>,
    next_order: AtomicU64,
    /// The proxy process's pid; 0 while there is none.
    proxy_pid: Arc<AtomicU32>,
    slots: Mutex<BTreeSet<u32>>,
    flows: Arc<Mutex<HashMap<String, VecDeque<Flow>>>>,
    /// Bytes of allowed connections, waiting to be reported as `egress_bytes` usage.
    usage: Arc<Mutex<Vec<sandbase_api::internal::UsageEvent>>>,
    /// Refusals waiting to go to the audit log.
    audit: Arc<Mutex<Vec<sandbase_api::internal::NodeAuditEvent>>>,
}

/// Refusals kept for the audit log while they wait to be reported.
const AUDIT_KEPT: usize = 10_000;

async fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new(program)
        .args(args)
        .output()
        .await
        .with_context(|| format!("running {program}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// Every address of this node's interfaces (`ip -o addr`).
async fn node_addresses_now() -> Vec<IpAddr> {
    let Ok(output) = Command::new("ip")
        .args(["-o", "addr", "show"])
        .output()
        .await
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().skip(2);
            let _family = fields.next()?;
            let address = fields.next()?.split('/').next()?;
            address.parse().ok()
        })
        .collect()
}

impl Network {
    /// Installs the firewall table and starts the proxy on the pool's addresses.
    pub async fn start(config: EgressConfig) -> anyhow::Result<Arc<Network>> {
        let pool = format!("{}/16", config.pool);
        let (http_port, tls_port, dns_port) = (
            config.proxy_port + 1,
            config.proxy_port + 2,
            config.proxy_port + 3,
        );
        // Redirected connections arrive at the host-side address of the sandbox's link, on
        // the transparent ports: the input chain sees those.
        let ruleset = format!(
            "table inet {TABLE}\n\
             delete table inet {TABLE}\n\
             table inet {TABLE} {{\n\
               chain prerouting {{\n\
                 type nat hook prerouting priority dstnat; policy accept;\n\
                 iifname \"{HOST_PREFIX}*\" tcp dport 80 redirect to :{http_port}\n\
                 iifname \"{HOST_PREFIX}*\" tcp dport 443 redirect to :{tls_port}\n\
                 iifname \"{HOST_PREFIX}*\" udp dport 53 redirect to :{dns_port}\n\
               }}\n\
               chain input {{\n\
                 type filter hook input priority -10; policy accept;\n\
                 iifname \"{HOST_PREFIX}*\" ip daddr {pool} tcp dport {{ {port}, {http_port}, {tls_port} }} ct state new,established accept\n\
                 iifname \"{HOST_PREFIX}*\" ip daddr {pool} udp dport {dns_port} accept\n\
                 iifname \"{HOST_PREFIX}*\" ct state established,related accept\n\
                 iifname \"{HOST_PREFIX}*\" counter drop\n\
               }}\n\
               chain forward {{\n\
                 type filter hook forward priority -10; policy accept;\n\
                 iifname \"{HOST_PREFIX}*\" counter drop\n\
                 oifname \"{HOST_PREFIX}*\" counter drop\n\
               }}\n\
             }}\n",
            port = config.proxy_port
        );
        let mut child = tokio::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("running nft (is nftables installed?)")?;
        if let Some(mut stdin) = child.stdin.take() {
            tokio::io::AsyncWriteExt::write_all(&mut stdin, ruleset.as_bytes()).await?;
        }
        let output = child.wait_with_output().await?;
        anyhow::ensure!(
            output.status.success(),
            "installing the egress firewall: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        let (sender, mut receiver) = mpsc::channel::<Flow>(4096);
        let mut node_addresses = config.node_addresses.clone();
        node_addresses.extend(node_addresses_now().await);
        let extra_ca = match &config.extra_ca {
            Some(pem) => Some(
                String::from_utf8(pem.clone()).context("the extra egress CA is not PEM text")?,
            ),
            None => None,
        };
        let process = ProcessConfig {
            proxy_port: config.proxy_port,
            resolver: match &config.resolver {
                Resolver::System => None,
                Resolver::Fixed(table) => Some(table.clone()),
            },
            node_addresses,
            extra_ca,
            connect_timeout_ms: 10_000,
            head_timeout_ms: 30_000,
            idle_timeout_ms: 120_000,
            user: config.proxy_user,
        };
        // A predecessor's proxy (its worker killed) leaves once it sees its input close;
        // until then its ports are taken.
        let mut attempt = 0;
        let first = loop {
            match ProxyProcess::start(&config.proxy_program, &process).await {
                Ok(first) => break first,
                Err(error) if attempt < 10 => {
                    attempt += 1;
                    tracing::debug!(error = format!("{error:#}"), "starting the egress proxy");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(error) => return Err(error),
            }
        };
        let registrations: Arc<Mutex<HashMap<IpAddr, Registration>>> = Arc::default();
        let (orders, order_receiver) = mpsc::unbounded_channel();
        let proxy_pid = Arc::new(AtomicU32::new(first.pid));
        tokio::spawn(
            Supervisor {
                program: config.proxy_program.clone(),
                process,
                restart_delay: config.restart_delay,
                registrations: Arc::clone(&registrations),
                orders: order_receiver,
                flows: sender,
                pid: Arc::clone(&proxy_pid),
            }
            .run(first),
        );
        let flows: Arc<Mutex<HashMap<String, VecDeque<Flow>>>> = Arc::default();
        let usage: Arc<Mutex<Vec<sandbase_api::internal::UsageEvent>>> = Arc::default();
        let audit: Arc<Mutex<Vec<sandbase_api::internal::NodeAuditEvent>>> = Arc::default();
        let kept = Arc::clone(&flows);
        let metered = Arc::clone(&usage);
        let audited = Arc::clone(&audit);
        // Event keys: unique per worker run (its start time) and connection.
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos())
            .unwrap_or_default();
        tokio::spawn(async move {
            let mut counter = 0u64;
            while let Some(flow) = receiver.recv().await {
                if let (Ok(sandbox), sandbase_egress::proxy::Decision::Denied(why)) =
                    (flow.sandbox.parse::<Uuid>(), &flow.decision)
                {
                    counter += 1;
                    let (action, mut details) = match &flow.leak {
                        Some(credential) => (
                            "sandbox.credential_leak_blocked",
                            serde_json::json!({ "credential": credential }),
                        ),
                        None => ("sandbox.egress_denied", serde_json::json!({})),
                    };
                    details["host"] = flow.host.clone().into();
                    details["port"] = flow.port.into();
                    details["mode"] = flow.mode.clone().into();
                    details["reason"] = why.clone().into();
                    let mut audit = audited.lock().unwrap_or_else(|p| p.into_inner());
                    if audit.len() < AUDIT_KEPT {
                        audit.push(sandbase_api::internal::NodeAuditEvent {
                            key: format!("egress:{run}:{counter}"),
                            sandbox,
                            action: action.to_owned(),
                            details,
                            occurred_at: flow.started_at.into(),
                        });
                    }
                }
                let bytes = flow.bytes_up + flow.bytes_down;
                if let (Ok(sandbox), true) = (flow.sandbox.parse::<Uuid>(), bytes > 0) {
                    counter += 1;
                    metered.lock().unwrap_or_else(|p| p.into_inner()).push(
                        sandbase_api::internal::UsageEvent {
                            key: format!("egress:{run}:{counter}"),
                            sandbox,
                            kind: "egress_bytes".to_owned(),
                            subject: String::new(),
                            quantity: bytes,
                            occurred_at: flow.started_at.into(),
                        },
                    );
                }
                let mut flows = kept.lock().unwrap_or_else(|p| p.into_inner());
                let list = flows.entry(flow.sandbox.clone()).or_default();
                if list.len() >= FLOWS_KEPT {
                    list.pop_front();
                }
                list.push_back(flow);
            }
        });
        Ok(Arc::new(Network {
            config,
            registrations,
            orders,
            next_order: AtomicU64::new(1),
            proxy_pid,
            slots: Mutex::new(BTreeSet::new()),
            flows,
            usage,
            audit,
        }))
    }

    pub fn proxy_port(&self) -> u16 {
        self.config.proxy_port
    }

    fn slot_addresses(&self, slot: u32) -> (Ipv4Addr, Ipv4Addr) {
        let base = u32::from(self.config.pool) + slot * 4;
        (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
    }

    /// Gives the sandbox whose first process is `pid` a link and registers its policy and
    /// credentials (with a CA of its own when it has any).
    pub async fn attach(
        &self,
        sandbox: Uuid,
        pid: u32,
        policy: Policy,
        credentials: Vec<sandbase_api::internal::SandboxCredential>,
    ) -> anyhow::Result<Attached> {
        let mut placeholders = Vec::new();
        let interception = if credentials.is_empty() {
            None
        } else {
            let mut ready = Vec::new();
            for given in credentials {
                let (credential, variable) = credential(given)?;
                ready.push(credential);
                placeholders.extend(variable);
            }
            let ca = Authority::generate_keys(&sandbox.to_string())
                .context("generating the sandbox's CA")?;
            Some(InterceptionSpec {
                credentials: ready,
                ca,
            })
        };
        let ca_pem = interception
            .as_ref()
            .map(|interception| interception.ca.certificate_pem.clone());
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let slot = (0..16_383u32)
                .find(|slot| !slots.contains(slot))
                .context("the egress address pool is exhausted")?;
            slots.insert(slot);
            slot
        };
        let (host, address) = self.slot_addresses(slot);
        let attached = Attached {
            slot,
            host,
            address,
            link: format!("{HOST_PREFIX}{slot}"),
            ca_pem,
            placeholders,
        };
        if let Err(error) = self.configure(&attached, pid).await {
            self.detach(&attached).await;
            return Err(error);
        }
        let registration = Registration {
            address: IpAddr::V4(address),
            sandbox: sandbox.to_string(),
            policy,
            max_connections: self.config.max_connections,
            interception,
        };
        let done = {
            let mut registrations = self.registrations.lock().unwrap_or_else(|p| p.into_inner());
            let done = self.order(Order::Add(Box::new(registration.clone())));
            registrations.insert(IpAddr::V4(address), registration);
            done
        };
        self.confirmed(done, sandbox).await;
        Ok(attached)
    }

    async fn configure(&self, attached: &Attached, pid: u32) -> anyhow::Result<()> {
        let peer = format!("sbs{}", attached.slot);
        let namespace = format!("sandbase-{}", attached.slot);
        let pid = pid.to_string();
        run("ip", &["link", "del", &attached.link]).await.ok();
        run(
            "ip",
            &[
                "link",
                "add",
                &attached.link,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
            ],
        )
        .await?;
        run("ip", &["link", "set", &peer, "netns", &pid]).await?;
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/30", attached.host),
                "dev",
                &attached.link,
            ],
        )
        .await?;
        run("ip", &["link", "set", &attached.link, "up"]).await?;
        // A name for the sandbox's namespace just long enough to configure it.
        run("ip", &["netns", "attach", &namespace, &pid]).await?;
        let inside = async {
            run(
                "ip",
                &[
                    "-n",
                    &namespace,
                    "addr",
                    "add",
                    &format!("{}/30", attached.address),
                    "dev",
                    &peer,
                ],
            )
            .await?;
            run(
                "ip",
                &["-n", &namespace, "link", "set", &peer, "name", "eth0"],
            )
            .await?;
            run("ip", &["-n", &namespace, "link", "set", "eth0", "up"]).await?;
            run(
                "ip",
                &[
                    "-n",
                    &namespace,
                    "route",
                    "add",
                    "default",
                    "via",
                    &attached.host.to_string(),
                ],
            )
            .await
        }
        .await;
        run("ip", &["netns", "delete", &namespace]).await.ok();
        inside
    }

    /// Removes the link (both ends) and the sandbox's registration.
    pub async fn detach(&self, attached: &Attached) {
        let address = IpAddr::V4(attached.address);
        {
            let mut registrations = self.registrations.lock().unwrap_or_else(|p| p.into_inner());
            registrations.remove(&address);
            drop(self.order(Order::Remove { address }));
        }
        if let Err(error) = run("ip", &["link", "del", &attached.link]).await {
            tracing::debug!(error = format!("{error:#}"), "removing a sandbox link");
        }
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&attached.slot);
    }

    /// Changes a sandbox's policy (new connections, once this returns); `false` when the
    /// sandbox has no registration.
    pub async fn set_policy(&self, attached: &Attached, sandbox: Uuid, policy: Policy) -> bool {
        let address = IpAddr::V4(attached.address);
        let done = {
            let mut registrations = self.registrations.lock().unwrap_or_else(|p| p.into_inner());
            let Some(registration) = registrations.get_mut(&address) else {
                return false;
            };
            registration.policy = policy.clone();
            self.order(Order::SetPolicy { address, policy })
        };
        self.confirmed(done, sandbox).await;
        true
    }

    /// Queues an order for the proxy process; the receiver fires once it is in effect.
    fn order(&self, order: Order) -> oneshot::Receiver<()> {
        let (done, confirmed) = oneshot::channel();
        let id = self.next_order.fetch_add(1, Ordering::Relaxed);
        let _ = self.orders.send((Envelope { id, order }, Some(done)));
        confirmed
    }

    /// Waits for the proxy to confirm an order. When it is down, the order is in the
    /// registrations the next process gets; until then the sandbox reaches nothing.
    async fn confirmed(&self, done: oneshot::Receiver<()>, sandbox: Uuid) {
        match tokio::time::timeout(Duration::from_secs(10), done).await {
            Ok(Ok(())) => {}
            _ => tracing::warn!(
                %sandbox,
                "the egress proxy did not confirm in time; the sandbox's egress waits for it"
            ),
        }
    }

    /// The egress proxy process, while one runs.
    pub fn proxy_pid(&self) -> Option<u32> {
        match self.proxy_pid.load(Ordering::Relaxed) {
            0 => None,
            pid => Some(pid),
        }
    }

    /// Egress usage not handed to the usage outbox yet.
    pub fn take_usage(&self) -> Vec<sandbase_api::internal::UsageEvent> {
        std::mem::take(&mut *self.usage.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Refusals not handed to the usage outbox yet.
    pub fn take_audit(&self) -> Vec<sandbase_api::internal::NodeAuditEvent> {
        std::mem::take(&mut *self.audit.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The sandbox's recent connections, oldest first.
    pub fn flows(&self, sandbox: Uuid) -> Vec<Flow> {
        self.flows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&sandbox.to_string())
            .map(|list| list.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// A running proxy process: its orders go in, its reports come out.
struct ProxyProcess {
    child: tokio::process::Child,
    input: tokio::process::ChildStdin,
    output: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    pid: u32,
}

impl ProxyProcess {
    /// Starts one and waits until it listens.
    async fn start(program: &std::path::Path, config: &ProcessConfig) -> anyhow::Result<Self> {
        let mut child = Command::new(program)
            .arg("egress-proxy")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the egress proxy ({})", program.display()))?;
        if let Some(log) = child.stderr.take() {
            tokio::spawn(relay_log(log));
        }
        let mut input = child.stdin.take().context("the proxy's standard input")?;
        let output = child.stdout.take().context("the proxy's standard output")?;
        let mut line = serde_json::to_vec(config)?;
        line.push(b'\n');
        input.write_all(&line).await?;
        input.flush().await?;
        let mut output = tokio::io::BufReader::new(output).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), output.next_line()).await;
        match first {
            Ok(Ok(Some(line))) => match serde_json::from_str::<Report>(&line) {
                Ok(Report::Ready { pid }) => Ok(ProxyProcess {
                    child,
                    input,
                    output,
                    pid,
                }),
                _ => anyhow::bail!("the egress proxy said something unexpected: {line}"),
            },
            _ => {
                let _ = child.start_kill();
                let status = child.wait().await.ok();
                anyhow::bail!(
                    "the egress proxy did not start (exit: {})",
                    status.map(|status| status.to_string()).unwrap_or_default()
                )
            }
        }
    }

    async fn send(&mut self, envelope: &Envelope) -> std::io::Result<()> {
        // The line may hold credential values: zeroed once written.
        let mut line = Zeroizing::new(serde_json::to_vec(envelope).map_err(std::io::Error::other)?);
        line.push(b'\n');
        self.input.write_all(&line).await?;
        self.input.flush().await
    }
}

/// The proxy's log lines (`LEVEL target: message fields`), logged as the worker's own under
/// the `egress_proxy` target, until the process closes its standard error.
async fn relay_log(log: tokio::process::ChildStderr) {
    let mut lines = tokio::io::BufReader::new(log).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = line.trim_start();
        let (level, rest) = line.split_once(' ').unwrap_or(("", line));
        let rest = rest.trim_start();
        match level {
            "ERROR" => tracing::error!(target: "egress_proxy", "{rest}"),
            "WARN" => tracing::warn!(target: "egress_proxy", "{rest}"),
            "INFO" => tracing::info!(target: "egress_proxy", "{rest}"),
            "DEBUG" => tracing::debug!(target: "egress_proxy", "{rest}"),
            "TRACE" => tracing::trace!(target: "egress_proxy", "{rest}"),
            // Not the proxy's logger (a panic, the C library): worth a look.
            _ => tracing::warn!(target: "egress_proxy", "{line}"),
        }
    }
}

/// Keeps a proxy process running and in step with the registrations.
struct Supervisor {
    program: PathBuf,
    process: ProcessConfig,
    restart_delay: Duration,
    registrations: Arc<Mutex<HashMap<IpAddr, Registration>>>,
    orders: mpsc::UnboundedReceiver<(Envelope, Option<oneshot::Sender<()>>)>,
    flows: mpsc::Sender<Flow>,
    pid: Arc<AtomicU32>,
}

impl Supervisor {
    /// Until the network is dropped (its order queue closes).
    async fn run(mut self, first: ProxyProcess) {
        let mut running = Some(first);
        loop {
            let mut process = match running.take() {
                Some(process) => process,
                None => match ProxyProcess::start(&self.program, &self.process).await {
                    Ok(mut process) => {
                        if self.replay(&mut process).await.is_err() {
                            self.pause().await;
                            continue;
                        }
                        tracing::info!(pid = process.pid, "the egress proxy is back");
                        process
                    }
                    Err(error) => {
                        tracing::error!(
                            error = format!("{error:#}"),
                            "restarting the egress proxy"
                        );
                        if self.pause().await {
                            return;
                        }
                        continue;
                    }
                },
            };
            self.pid.store(process.pid, Ordering::Relaxed);
            let mut waiting: HashMap<u64, oneshot::Sender<()>> = HashMap::new();
            loop {
                tokio::select! {
                    order = self.orders.recv() => {
                        let Some((envelope, done)) = order else {
                            // The network is gone: so is its proxy (killed on drop).
                            self.pid.store(0, Ordering::Relaxed);
                            return;
                        };
                        if process.send(&envelope).await.is_err() {
                            break;
                        }
                        if let Some(done) = done {
                            waiting.insert(envelope.id, done);
                        }
                    }
                    line = process.output.next_line() => {
                        let Ok(Some(line)) = line else { break };
                        match serde_json::from_str::<Report>(&line) {
                            Ok(Report::Done { id }) => {
                                if let Some(done) = waiting.remove(&id) {
                                    let _ = done.send(());
                                }
                            }
                            Ok(Report::Flow { flow }) => {
                                let _ = self.flows.try_send(*flow);
                            }
                            Ok(Report::Ready { .. }) | Err(_) => {}
                        }
                    }
                }
            }
            self.pid.store(0, Ordering::Relaxed);
            let _ = process.child.start_kill();
            let status = process.child.wait().await;
            tracing::error!(
                status = ?status,
                "the egress proxy exited: sandboxes reach nothing until another one runs"
            );
            if self.pause().await {
                return;
            }
        }
    }

    /// Everything registered, to a new process.
    async fn replay(&self, process: &mut ProxyProcess) -> std::io::Result<()> {
        let registrations: Vec<Registration> = self
            .registrations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for registration in registrations {
            let envelope = Envelope {
                id: 0,
                order: Order::Add(Box::new(registration)),
            };
            process.send(&envelope).await?;
        }
        Ok(())
    }

    /// Waits out the restart delay; `true` when the network is gone meanwhile.
    async fn pause(&self) -> bool {
        tokio::time::sleep(self.restart_delay).await;
        self.orders.is_closed()
    }
}
