//! The egress proxy. Its explicit listener takes HTTP `CONNECT host:port` (tunnels) and
//! plain HTTP requests in absolute form; its transparent listeners take what nftables
//! redirects there from sandboxes' TCP ports 80 (the host from the `Host` header) and 443 (the
//! host from the TLS ClientHello's server name). A connection is accepted only from a
//! registered sandbox address; its host must be a name (not an IP literal) its policy allows,
//! the names a connection gives (CONNECT target, SNI, `Host`) must agree, and the name is
//! resolved here, every address checked by the SSRF guard, and exactly a checked address
//! dialed. Refusals are explained (403 naming the host and why; a refused TLS connection is
//! closed after its ClientHello) and every connection ends as a [`Flow`].
//!
//! TLS to a host one of the sandbox's credentials is bound to (and, when it holds
//! placeholders, to every host on port 443) is intercepted: the sandbox's own CA signs a
//! certificate for the host, the upstream is verified against the system's roots, and each
//! request gets its credentials injected — or is stopped when it carries a placeholder to a
//! host that is not the placeholder's.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::policy::Policy;
use crate::relay;
use crate::sni::Hello;
use crate::ssrf;
use crate::stream::Tap;

mod body;
mod flow;
mod registry;
mod session;
mod store;
mod store_rules;
mod target;

use target::{Target, parse_target, read_head, read_hello};

pub use flow::{Decision, Flow};
pub use registry::{Entry, Interception, Registry, Resolver};
pub use store::StoreRoute;

pub struct ProxyConfig {
    /// Addresses of this node (refused as upstreams, like internal ones).
    pub node_addresses: Vec<IpAddr>,
    /// Networks the operator refuses as upstreams (the fleet's NAT and public addresses).
    pub denied_networks: Vec<ssrf::Cidr>,
    pub connect_timeout: Duration,
    /// How long a sandbox may take to send a request head (or TLS handshake).
    pub head_timeout: Duration,
    /// How long a relayed connection may stay silent both ways.
    pub idle_timeout: Duration,
    /// Trust for upstream servers of intercepted connections.
    pub upstream_tls: Arc<rustls::ClientConfig>,
    /// Connections carried at once, all sandboxes together (from the open-file limit):
    /// each sandbox also has its own cap, so none can take them all.
    pub max_connections: usize,
    /// Where the store host's requests go (the gateway); `None`: nowhere.
    pub store: Option<Arc<StoreRoute>>,
}

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// `HTTP_PROXY`: CONNECT and absolute-form requests.
    Explicit,
    /// Redirected port 80: origin-form requests, the host from `Host`.
    TransparentHttp,
    /// Redirected port 443: TLS, the host from the ClientHello.
    TransparentTls,
}

pub struct Proxy {
    pub registry: Arc<Registry>,
    resolver: Resolver,
    /// What is left of `config.max_connections`.
    budget: Arc<tokio::sync::Semaphore>,
    config: ProxyConfig,
    flows: mpsc::Sender<Flow>,
}

/// How long the accept loop waits after a failed accept (EMFILE).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The answer to a CONNECT the proxy serves.
const CONNECTED: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";

/// A sandbox's connection, its target read.
struct Connection {
    stream: TcpStream,
    kind: Listener,
    target: Target,
    /// What was read from the sandbox so far (the head, or the ClientHello).
    buffer: Vec<u8>,
    /// Where the head ends in `buffer` (0 for a ClientHello, which is replayed whole).
    head_len: usize,
    /// The sandbox's running byte total.
    meter: Arc<AtomicU64>,
}

/// How an admitted connection is carried, chosen once.
enum Path {
    /// TLS opened with the sandbox's CA: credentials injected, placeholders watched.
    Intercept(Arc<Interception>),
    /// Plain HTTP, request by request.
    Plain(Option<Arc<Interception>>),
    /// Bytes both ways, untouched.
    Tunnel,
}

impl Path {
    fn of(target: &Target, interception: Option<&Arc<Interception>>) -> Path {
        if target.plain {
            return Path::Plain(interception.cloned());
        }
        match interception {
            Some(interception) if interception.wants(&target.host, target.port) => {
                Path::Intercept(Arc::clone(interception))
            }
            _ => Path::Tunnel,
        }
    }
}

impl Proxy {
    pub fn new(
        registry: Arc<Registry>,
        resolver: Resolver,
        config: ProxyConfig,
        flows: mpsc::Sender<Flow>,
    ) -> Arc<Proxy> {
        Arc::new(Proxy {
            registry,
            resolver,
            budget: Arc::new(tokio::sync::Semaphore::new(config.max_connections)),
            config,
            flows,
        })
    }

    /// Serves a listener until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, kind: Listener) {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                // Out of descriptors (or another passing failure): wait for some to close
                // instead of spinning on the error.
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            };
            let proxy = Arc::clone(&self);
            tokio::spawn(async move { proxy.handle(stream, peer, kind).await });
        }
    }

    /// Reads what names the target: a request head, or a TLS ClientHello.
    async fn read_target(
        &self,
        stream: &mut TcpStream,
        kind: Listener,
        buffer: &mut Vec<u8>,
    ) -> Result<(Target, usize), Option<String>> {
        if kind == Listener::TransparentTls {
            let hello = tokio::time::timeout(self.config.head_timeout, read_hello(stream, buffer))
                .await
                .map_err(|_| None)?
                .map_err(|_| None)?;
            return match hello {
                Hello::Name(host) => {
                    // No IP literals: an SNI is a name, and only names are allowed.
                    if host.parse::<IpAddr>().is_ok() {
                        return Err(None);
                    }
                    Ok((
                        Target {
                            mode: "transparent-tls",
                            host,
                            port: 443,
                            plain: false,
                        },
                        0,
                    ))
                }
                _ => Err(None),
            };
        }
        let head = tokio::time::timeout(self.config.head_timeout, read_head(stream, buffer))
            .await
            .map_err(|_| None)?
            .map_err(|_| None)?;
        let redirected = (kind == Listener::TransparentHttp).then_some(80);
        let target = parse_target(&buffer[..head], redirected).map_err(Some)?;
        Ok((target, head))
    }

    async fn handle(&self, mut stream: TcpStream, peer: SocketAddr, kind: Listener) {
        // Only sandboxes: anything else is closed without a word.
        let Some(entry) = self.registry.get(peer.ip()) else {
            return;
        };
        let started = Instant::now();
        // Small writes (a CONNECT answer, a request head) go out at once, not after Nagle's
        // delay meets the peer's delayed ACK.
        let _ = stream.set_nodelay(true);
        let _permits = match self.room_for(&entry) {
            Ok(permits) => permits,
            Err(why) => {
                if kind != Listener::TransparentTls {
                    let _ = deny(&mut stream, 429, why).await;
                }
                return;
            }
        };
        let mut buffer = Vec::with_capacity(2048);
        let (target, head_len) = match self.read_target(&mut stream, kind, &mut buffer).await {
            Ok(found) => found,
            Err(Some(why)) => {
                let _ = deny(&mut stream, 400, &why).await;
                return;
            }
            Err(None) => return,
        };
        let mut flow = Flow::new(&entry.sandbox, &target);
        let connection = Connection {
            stream,
            kind,
            target,
            buffer,
            head_len,
            meter: Arc::clone(&entry.metered),
        };
        if connection.target.host == crate::STORE_HOST {
            self.to_store(&entry, connection, &mut flow).await;
            self.record(flow, started);
            return;
        }
        match self.admit(&entry, &connection, &mut flow).await {
            Ok((upstream, address)) => {
                flow.address = Some(address);
                let path = Path::of(&connection.target, entry.interception.as_ref());
                self.relay(path, connection, upstream, &mut flow).await;
            }
            Err(decision) => {
                let mut stream = connection.stream;
                if kind != Listener::TransparentTls {
                    let (status, why) = match &decision {
                        Decision::Denied(why) => (403, why.as_str()),
                        Decision::Failed(why) => (502, why.as_str()),
                        Decision::Allowed => (502, ""),
                    };
                    let _ = deny(&mut stream, status, why).await;
                }
                flow.decision = decision;
            }
        }
        self.record(flow, started);
    }

    /// Logs a connection's flow and reports it.
    fn record(&self, mut flow: Flow, started: Instant) {
        flow.duration = started.elapsed();
        tracing::info!(
            sandbox = %flow.sandbox, host = %flow.host, port = flow.port, mode = flow.mode,
            decision = ?flow.decision, intercepted = flow.intercepted,
            credentials = ?flow.credentials, up = flow.bytes_up, down = flow.bytes_down,
            "egress"
        );
        let _ = self.flows.try_send(flow);
    }

    /// Room for one more connection of `entry`'s: its rate of new connections, its own cap
    /// on open ones, and the proxy's budget for all sandboxes together.
    fn room_for<'e>(
        &self,
        entry: &'e Entry,
    ) -> Result<
        (
            tokio::sync::SemaphorePermit<'e>,
            tokio::sync::OwnedSemaphorePermit,
        ),
        &'static str,
    > {
        if !entry.opens.take() {
            return Err("this sandbox opens connections too fast");
        }
        let own = entry
            .connections
            .try_acquire()
            .map_err(|_| "too many connections from this sandbox")?;
        let shared = Arc::clone(&self.budget)
            .try_acquire_owned()
            .map_err(|_| "the node's egress proxy is at its connection limit")?;
        Ok((own, shared))
    }

    /// Whether the connection may go out, and to which checked address: plain HTTP is read,
    /// not opened, so a placeholder in its head goes nowhere, whatever the host (credentials
    /// are only ever sent over TLS); then policy, resolution, the guard and the dial.
    async fn admit(
        &self,
        entry: &Entry,
        connection: &Connection,
        flow: &mut Flow,
    ) -> Result<(TcpStream, SocketAddr), Decision> {
        let leaked = match &entry.interception {
            Some(interception) if connection.target.plain => interception
                .placeholder_in(&connection.buffer)
                .map(str::to_owned),
            _ => None,
        };
        if let Some(name) = leaked {
            flow.leak = Some(name.clone());
            return Err(Decision::Denied(format!(
                "the request carries the placeholder of credential `{name}`, which is only sent over HTTPS to its own hosts; blocked"
            )));
        }
        self.open(entry, &connection.target, flow).await
    }

    /// Carries an admitted connection to its upstream along its path.
    async fn relay(
        &self,
        path: Path,
        connection: Connection,
        upstream: TcpStream,
        flow: &mut Flow,
    ) {
        if matches!(path, Path::Tunnel) {
            self.tunnel(connection, upstream, flow).await;
            return;
        }
        let Connection {
            mut stream,
            kind,
            target,
            buffer,
            head_len,
            meter,
        } = connection;
        match path {
            Path::Intercept(interception) => {
                let replay = if kind == Listener::Explicit {
                    if stream.write_all(CONNECTED).await.is_err() {
                        return;
                    }
                    buffer[head_len..].to_vec()
                } else {
                    buffer
                };
                self.intercept(
                    Tap::new(stream, replay, meter),
                    interception,
                    &target,
                    upstream,
                    flow,
                )
                .await;
            }
            Path::Plain(interception) => {
                // The head read so far is replayed to the HTTP server.
                let tap = Tap::new(stream, buffer, meter);
                self.plain(tap, interception, &target, kind, upstream, flow)
                    .await;
            }
            Path::Tunnel => {}
        }
    }

    /// Bytes both ways, untouched (spliced in the kernel). On the explicit listener the
    /// CONNECT is answered first and the client's TLS must name the tunnel's host.
    async fn tunnel(&self, connection: Connection, mut upstream: TcpStream, flow: &mut Flow) {
        let Connection {
            mut stream,
            kind,
            target,
            mut buffer,
            head_len,
            meter,
        } = connection;
        let mut first = buffer.split_off(head_len);
        let sent = match kind {
            Listener::Explicit => {
                stream.write_all(CONNECTED).await.is_ok()
                    && match self
                        .tunnel_agrees(&mut stream, &upstream, &target.host, &mut first)
                        .await
                    {
                        Ok(()) => upstream.write_all(&first).await.is_ok(),
                        Err(why) => {
                            flow.decision = Decision::Denied(why);
                            false
                        }
                    }
            }
            _ => upstream.write_all(&first).await.is_ok(),
        };
        if sent {
            meter.fetch_add(first.len() as u64, Ordering::Relaxed);
            let relayed =
                relay::relay_metered(&stream, &upstream, self.config.idle_timeout, &meter).await;
            flow.bytes_up = relayed.forward + first.len() as u64;
            flow.bytes_down = relayed.backward;
        }
    }

    /// In a CONNECT tunnel, TLS must name the host the tunnel is for: a ClientHello with
    /// another server name (a fronted host on a shared address) is refused. The client's
    /// first bytes are read into `first` when it speaks first; when the upstream does
    /// (SMTP, databases), there is nothing to check.
    async fn tunnel_agrees(
        &self,
        stream: &mut TcpStream,
        upstream: &TcpStream,
        host: &str,
        first: &mut Vec<u8>,
    ) -> Result<(), String> {
        if first.is_empty() {
            let client_first = tokio::select! {
                ready = stream.readable() => ready.is_ok(),
                _ = upstream.readable() => false,
                () = tokio::time::sleep(self.config.head_timeout) => false,
            };
            if !client_first {
                return Ok(());
            }
        }
        let hello = tokio::time::timeout(self.config.head_timeout, read_hello(stream, first)).await;
        // A tunnel to an address literal has no name to agree with.
        let by_name = host.parse::<IpAddr>().is_err();
        match hello {
            Ok(Ok(Hello::Name(name))) if name != host => Err(format!(
                "the TLS server name {name} is not {host}, the host this tunnel was opened for"
            )),
            Ok(Ok(Hello::NoName)) if by_name => Err(format!(
                "TLS without a server name; this tunnel is for {host} and must say so"
            )),
            Ok(Ok(Hello::Encrypted)) if by_name => Err(
                "Encrypted Client Hello hides the server name, which must be this tunnel's host"
                    .to_owned(),
            ),
            // The right name, not TLS — or the client went quiet or away, which the relay
            // sees too.
            _ => Ok(()),
        }
    }

    /// Policy, resolution, the SSRF guard, then a connection to a checked address.
    async fn open(
        &self,
        entry: &Entry,
        target: &Target,
        flow: &mut Flow,
    ) -> Result<(TcpStream, SocketAddr), Decision> {
        let policy = entry.policy();
        if !policy.allows(&target.host, target.port) {
            return Err(Decision::Denied(format!(
                "{}:{} is not allowed by this sandbox's egress policy (allowed: {})",
                target.host,
                target.port,
                describe(&policy)
            )));
        }
        let addresses = self
            .resolver
            .resolve(&target.host, target.port)
            .await
            .map_err(|_| Decision::Failed(format!("{} does not resolve", target.host)))?;
        if addresses.is_empty() {
            return Err(Decision::Failed(format!(
                "{} does not resolve",
                target.host
            )));
        }
        // Every address must pass: a name that resolves to one internal address among
        // public ones is refused outright.
        for address in &addresses {
            let checked = ssrf::check(
                *address,
                &self.config.node_addresses,
                &self.config.denied_networks,
            );
            if let Err(blocked) = checked {
                // The sandbox learns the kind of address, not which one; the team's flow
                // log keeps the address.
                flow.address = Some(SocketAddr::new(*address, target.port));
                return Err(Decision::Denied(format!(
                    "{} resolves to {}; refused",
                    target.host,
                    blocked.as_str()
                )));
            }
        }
        let address = SocketAddr::new(addresses[0], target.port);
        let stream = tokio::time::timeout(self.config.connect_timeout, TcpStream::connect(address))
            .await
            .map_err(|_| {
                Decision::Failed(format!(
                    "{}:{} did not answer in time",
                    target.host, target.port
                ))
            })?
            .map_err(|error| {
                Decision::Failed(format!("{}:{}: {error}", target.host, target.port))
            })?;
        let _ = stream.set_nodelay(true);
        Ok((stream, address))
    }
}

fn describe(policy: &Policy) -> String {
    if policy.allow.is_empty() {
        return "nothing".to_owned();
    }
    policy
        .allow
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

async fn deny(stream: &mut TcpStream, status: u16, why: &str) -> std::io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        429 => "Too Many Requests",
        _ => "Bad Gateway",
    };
    let body = format!("SandBase egress: {why}\n");
    let answer = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await
}
