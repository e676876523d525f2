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

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use sandbase_egress::Policy;
use sandbase_egress::credentials::{CredentialSpec, Injection, placeholder_for};
use sandbase_egress::process::{Envelope, InterceptionSpec, Order, ProcessConfig, Registration};
use sandbase_egress::proxy::{Flow, Resolver};
use sandbase_egress::tls::Authority;
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

mod firewall;
mod flows;
mod supervisor;

use firewall::HOST_PREFIX;
pub use firewall::TABLE;
use flows::FlowBook;
use supervisor::{ProxyProcess, Supervisor};

#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// A /16 whose /30s go to sandboxes (e.g. 10.213.0.0).
    pub pool: Ipv4Addr,
    /// The proxy's port on each sandbox's host-side address.
    pub proxy_port: u16,
    /// How the proxy resolves names (the system's resolver, names pinned before it, or an
    /// explicit table for tests).
    pub resolver: Resolver,
    /// Addresses of this node that no sandbox may reach through the proxy.
    pub node_addresses: Vec<IpAddr>,
    /// Networks no sandbox may reach (the fleet's NAT and public addresses, …).
    pub denied_networks: Vec<sandbase_egress::ssrf::Cidr>,
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
    } else if let Some(placeholder) = &inject.placeholder {
        let options = placeholder.options();
        let placeholder = placeholder_for(&value);
        variable = Some((options.env.clone(), placeholder.clone()));
        Injection::Placeholder {
            env: options.env,
            placeholder,
            in_body: options.in_body,
            in_url: options.in_url,
            paths: options.paths,
            headers: if options.headers.is_empty() {
                sandbase_egress::credentials::default_placeholder_headers()
            } else {
                options.headers
            },
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

/// How long a removed sandbox's running byte total is kept (for the proxy's last report).
const TOTAL_KEPT_AFTER_REMOVAL: Duration = Duration::from_secs(60);

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
    /// Flow records, and the usage and audit events made of them.
    book: Arc<FlowBook>,
}

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
    /// `store`: where sandboxes with store access reach the store (the gateway).
    pub async fn start(
        config: EgressConfig,
        store: Option<sandbase_egress::process::StoreUpstream>,
    ) -> anyhow::Result<Arc<Network>> {
        firewall::install(&firewall::ruleset(config.pool, config.proxy_port)).await?;
        let (sender, receiver) = mpsc::channel::<Flow>(4096);
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
            resolver: config.resolver.clone(),
            node_addresses,
            denied_networks: config.denied_networks.clone(),
            extra_ca,
            connect_timeout_ms: 10_000,
            head_timeout_ms: 30_000,
            idle_timeout_ms: 120_000,
            user: config.proxy_user,
            store,
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
        let book = Arc::new(FlowBook::default());
        tokio::spawn(
            Supervisor {
                program: config.proxy_program.clone(),
                process,
                restart_delay: config.restart_delay,
                registrations: Arc::clone(&registrations),
                orders: order_receiver,
                flows: sender,
                book: Arc::clone(&book),
                pid: Arc::clone(&proxy_pid),
            }
            .run(first),
        );
        tokio::spawn(Arc::clone(&book).keep(receiver));
        Ok(Arc::new(Network {
            config,
            registrations,
            orders,
            next_order: AtomicU64::new(1),
            proxy_pid,
            slots: Mutex::new(BTreeSet::new()),
            book,
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
        store: Option<sandbase_egress::process::StoreToken>,
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
            store,
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
            let removed = registrations.remove(&address);
            drop(self.order(Order::Remove { address }));
            // Its running total is kept a while for the proxy's last report, then dropped.
            if let Some(registration) = removed {
                let book = Arc::clone(&self.book);
                tokio::spawn(async move {
                    tokio::time::sleep(TOTAL_KEPT_AFTER_REMOVAL).await;
                    book.forget(&registration.sandbox);
                });
            }
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
        self.book.take_usage()
    }

    /// Refusals not handed to the usage outbox yet.
    pub fn take_audit(&self) -> Vec<sandbase_api::internal::NodeAuditEvent> {
        self.book.take_audit()
    }

    /// The sandbox's recent connections, oldest first.
    pub fn flows(&self, sandbox: Uuid) -> Vec<Flow> {
        self.book.flows(sandbox)
    }
}
