//! The egress proxy as a process of its own, supervised by its worker.
//!
//! The worker starts it (`sandbase egress-proxy`), writes one line of JSON with its
//! [`ProcessConfig`] to its standard input and then [`Envelope`]s — sandboxes registered,
//! removed, their policies changed — one per line; the process answers on its standard
//! output with [`Report`]s: `ready` once it listens, `done` for each order, and every
//! connection's flow record. It binds its listeners (the explicit proxy on `proxy_port`, the
//! transparent ones on `+ 1` and `+ 2`, the DNS responder on UDP `+ 3`) while still root,
//! then gives up root for good — another user, no supplementary groups, no new privileges —
//! before it reads a byte from a sandbox. When its standard input closes (the worker is
//! gone) it exits.
//!
//! While it is down, nothing listens behind the worker's redirections and its firewall drops
//! everything else: sandboxes reach nothing (fail closed). The worker keeps every
//! registration — policies, credentials, CA keys — and sends them all again to the process
//! it starts next.

use std::collections::HashMap;
use std::io::BufRead as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use zeroize::{Zeroize as _, Zeroizing};

use crate::credentials::CredentialSpec;
use crate::dns::Responder;
use crate::policy::Policy;
use crate::proxy::{Flow, Interception, Listener, Proxy, ProxyConfig, Registry, Resolver};
use crate::tls::{Authority, CaKeys};

/// The first line the worker writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessConfig {
    /// The explicit listener's port; the transparent HTTP, TLS and DNS listeners take the
    /// three after it.
    pub proxy_port: u16,
    /// How the proxy and the DNS responder resolve names.
    pub resolver: Resolver,
    /// Refused as upstreams, like internal addresses.
    pub node_addresses: Vec<IpAddr>,
    /// Networks refused as upstreams (the operator's deny-list).
    #[serde(default)]
    pub denied_networks: Vec<crate::ssrf::Cidr>,
    /// Certificates (PEM) trusted for upstreams besides the system's roots.
    pub extra_ca: Option<String>,
    pub connect_timeout_ms: u64,
    pub head_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    /// The user and group to become after binding (when started as root).
    pub user: Option<(u32, u32)>,
    /// Where the store host leads; `None`: no store from this node.
    #[serde(default)]
    pub store: Option<StoreUpstream>,
}

/// The gateway as the worker reaches it, for the store host's requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreUpstream {
    /// Its base URL (`https://gateway.internal:8081`).
    pub url: String,
    /// The internal channel's CA (PEM): trusted alone for an `https` URL.
    pub ca_pem: Option<String>,
}

/// A sandbox's store credential (`Authorization: Bearer …` on its store requests). Its
/// `Debug` leaves the value out; it is wiped when dropped.
#[derive(Clone, Serialize, Deserialize)]
pub struct StoreToken(pub Zeroizing<String>);

impl std::fmt::Debug for StoreToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreToken(..)")
    }
}

/// A sandbox as the proxy should know it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Registration {
    pub address: IpAddr,
    pub sandbox: String,
    pub policy: Policy,
    pub max_connections: usize,
    /// Its credentials and CA, when it has credentials.
    pub interception: Option<InterceptionSpec>,
    /// Its store credential, when it was created with store access.
    #[serde(default)]
    pub store: Option<StoreToken>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InterceptionSpec {
    pub credentials: Vec<CredentialSpec>,
    pub ca: CaKeys,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Order {
    /// Registers (or replaces) a sandbox.
    Add(Box<Registration>),
    Remove {
        address: IpAddr,
    },
    SetPolicy {
        address: IpAddr,
        policy: Policy,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub id: u64,
    pub order: Order,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Report {
    /// Listening (and no longer root).
    Ready {
        pid: u32,
    },
    /// The order with this id is in effect.
    Done {
        id: u64,
    },
    Flow {
        flow: Box<Flow>,
    },
    /// A sandbox's running total of bytes moved (both ways, DNS included): sent every
    /// [`METER_INTERVAL`] while it changes, and once more when the sandbox is removed. The
    /// worker meters the differences, so a lost report loses nothing.
    Metered {
        sandbox: String,
        bytes: u64,
    },
}

/// How often running byte totals are reported.
pub const METER_INTERVAL: Duration = Duration::from_millis(500);

/// The process's `main`: reads its configuration, binds, drops root, serves until its
/// standard input closes.
pub fn run() -> Result<(), String> {
    let mut line = Zeroizing::new(String::new());
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|error| format!("reading the configuration: {error}"))?;
    let config: ProcessConfig =
        serde_json::from_str(&line).map_err(|error| format!("the configuration: {error}"))?;
    let port = config.proxy_port;
    let bind = |port: u16| {
        let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
            .map_err(|error| format!("binding the egress proxy to port {port}: {error}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|error| error.to_string())?;
        Ok::<_, String>(listener)
    };
    let listeners = [
        (bind(port)?, Listener::Explicit),
        (bind(port + 1)?, Listener::TransparentHttp),
        (bind(port + 2)?, Listener::TransparentTls),
    ];
    let dns = std::net::UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port + 3)))
        .map_err(|error| {
            format!(
                "binding the DNS responder to UDP port {}: {error}",
                port + 3
            )
        })?;
    dns.set_nonblocking(true)
        .map_err(|error| error.to_string())?;
    let upstream_tls = crate::tls::upstream_config(config.extra_ca.as_deref().map(str::as_bytes))?;
    // As many connections as descriptors allow (the soft limit is often 1024).
    let open_files = crate::limits::raise_open_files();
    // Still one thread: dropping the ids here drops them for the whole process.
    if let Some((user, group)) = config.user {
        drop_root(user, group)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    runtime.block_on(serve(config, listeners, dns, upstream_tls, open_files))
}

fn drop_root(user: u32, group: u32) -> Result<(), String> {
    use rustix::thread::{Gid, Uid};
    if !rustix::process::getuid().is_root() {
        return Ok(());
    }
    let gid = Gid::from_raw(group);
    let uid = Uid::from_raw(user);
    rustix::thread::set_thread_groups(&[]).map_err(|error| format!("setgroups: {error}"))?;
    rustix::thread::set_thread_res_gid(gid, gid, gid)
        .map_err(|error| format!("setresgid: {error}"))?;
    rustix::thread::set_thread_res_uid(uid, uid, uid)
        .map_err(|error| format!("setresuid: {error}"))?;
    rustix::thread::set_no_new_privs(true).map_err(|error| format!("no_new_privs: {error}"))?;
    if rustix::process::getuid().is_root() || rustix::process::geteuid().is_root() {
        return Err("still root after dropping privileges".to_owned());
    }
    Ok(())
}

async fn serve(
    config: ProcessConfig,
    listeners: [(std::net::TcpListener, Listener); 3],
    dns: std::net::UdpSocket,
    upstream_tls: Arc<rustls::ClientConfig>,
    open_files: u64,
) -> Result<(), String> {
    let resolver = config.resolver;
    // A store route that cannot be made leaves the store unreachable, not the node's egress.
    let store = match config.store.as_ref().map(crate::proxy::StoreRoute::new) {
        Some(Ok(route)) => Some(Arc::new(route)),
        Some(Err(why)) => {
            tracing::error!(
                why,
                "no route to the store: sandboxes with store access get 502"
            );
            None
        }
        None => None,
    };
    let registry = Arc::new(Registry::default());
    let (flows, mut flow_receiver) = mpsc::channel::<Flow>(4096);
    let (reports, mut report_receiver) = mpsc::unbounded_channel::<Report>();
    let responder = Arc::new(Responder {
        registry: Arc::clone(&registry),
        resolver: resolver.clone(),
        node_addresses: config.node_addresses.clone(),
        denied_networks: config.denied_networks.clone(),
        flows: flows.clone(),
    });
    tokio::spawn(
        responder.serve(tokio::net::UdpSocket::from_std(dns).map_err(|error| error.to_string())?),
    );
    let proxy = Proxy::new(
        Arc::clone(&registry),
        resolver,
        ProxyConfig {
            node_addresses: config.node_addresses,
            denied_networks: config.denied_networks,
            connect_timeout: Duration::from_millis(config.connect_timeout_ms),
            head_timeout: Duration::from_millis(config.head_timeout_ms),
            idle_timeout: Duration::from_millis(config.idle_timeout_ms),
            upstream_tls,
            max_connections: crate::limits::connection_budget(open_files),
            store,
        },
        flows,
    );
    for (listener, kind) in listeners {
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(|error| error.to_string())?;
        tokio::spawn(Arc::clone(&proxy).serve(listener, kind));
    }
    // One writer for the standard output, a line per report.
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(report) = report_receiver.recv().await {
            let Ok(mut line) = serde_json::to_vec(&report) else {
                continue;
            };
            line.push(b'\n');
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    {
        let reports = reports.clone();
        tokio::spawn(async move {
            while let Some(flow) = flow_receiver.recv().await {
                let _ = reports.send(Report::Flow {
                    flow: Box::new(flow),
                });
            }
        });
    }
    tokio::spawn(report_meters(Arc::clone(&registry), reports.clone()));
    let _ = reports.send(Report::Ready {
        pid: std::process::id(),
    });
    let mut input = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = Zeroizing::new(String::new());
    loop {
        line.zeroize();
        match input.read_line(&mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let envelope: Envelope = match serde_json::from_str(&line) {
            Ok(envelope) => envelope,
            Err(error) => {
                // Never echo the line: it may hold a credential.
                tracing::error!(error = %error, "an order the egress proxy cannot read");
                continue;
            }
        };
        apply(&registry, envelope.order, &reports);
        let _ = reports.send(Report::Done { id: envelope.id });
    }
    drop(reports);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    Ok(())
}

/// Sends each sandbox's running byte total while it changes.
async fn report_meters(registry: Arc<Registry>, reports: mpsc::UnboundedSender<Report>) {
    let mut sent: HashMap<String, u64> = HashMap::new();
    loop {
        tokio::time::sleep(METER_INTERVAL).await;
        let entries = registry.entries();
        sent.retain(|sandbox, _| entries.iter().any(|entry| &entry.sandbox == sandbox));
        for entry in entries {
            let bytes = entry.metered.load(Ordering::Relaxed);
            if sent.get(&entry.sandbox) != Some(&bytes) {
                sent.insert(entry.sandbox.clone(), bytes);
                if reports
                    .send(Report::Metered {
                        sandbox: entry.sandbox.clone(),
                        bytes,
                    })
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

fn apply(registry: &Registry, order: Order, reports: &mpsc::UnboundedSender<Report>) {
    match order {
        Order::Add(registration) => {
            let Registration {
                address,
                sandbox,
                policy,
                max_connections,
                interception,
                store,
            } = *registration;
            let interception = match interception {
                None => None,
                Some(spec) => match Authority::from_keys(&sandbox, &spec.ca) {
                    Ok(authority) => Some(Arc::new(Interception {
                        credentials: spec.credentials.into_iter().map(Into::into).collect(),
                        authority,
                    })),
                    Err(why) => {
                        // Without its CA the sandbox gets no egress at all, not egress
                        // without its credentials' rules.
                        tracing::error!(sandbox, why, "the sandbox's CA cannot be restored");
                        registry.remove(address);
                        return;
                    }
                },
            };
            let store = store.map(|token| Arc::new(token.0));
            registry.add(
                address,
                &sandbox,
                policy,
                max_connections,
                interception,
                store,
            );
        }
        Order::Remove { address } => {
            if let Some(entry) = registry.remove(address) {
                let _ = reports.send(Report::Metered {
                    sandbox: entry.sandbox.clone(),
                    bytes: entry.metered.load(Ordering::Relaxed),
                });
            }
        }
        Order::SetPolicy { address, policy } => {
            registry.set_policy(address, policy);
        }
    }
}
