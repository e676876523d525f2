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

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

use crate::credentials::{BodyScan, Credential, Outcome};
use crate::policy::Policy;
use crate::relay;
use crate::sni::{self, Hello};
use crate::ssrf;
use crate::stream::Tap;
use crate::tls::Authority;

/// Largest request head read from a sandbox.
const MAX_HEAD: usize = 16 * 1024;

/// A sandbox as the proxy knows it: who it is and what it may reach (changed at run time
/// with [`Registry::set_policy`]; effective for new connections).
pub struct Entry {
    pub sandbox: String,
    policy: RwLock<Arc<Policy>>,
    connections: Semaphore,
    interception: Option<Arc<Interception>>,
}

/// A sandbox's credentials and the CA its intercepted connections are signed by; both live
/// only here, in memory (values zeroed when the sandbox is removed).
pub struct Interception {
    pub credentials: Vec<Credential>,
    pub authority: Authority,
}

impl Interception {
    /// Whether TLS to `host:port` is opened: a credential is bound to it, or the sandbox holds
    /// placeholders that must not leave for other HTTPS hosts.
    fn wants(&self, host: &str, port: u16) -> bool {
        self.credentials
            .iter()
            .any(|credential| credential.binds(host, port))
            || (port == 443
                && self
                    .credentials
                    .iter()
                    .any(|credential| credential.placeholder().is_some()))
    }

    /// The credential whose placeholder is in `bytes` (plain HTTP: no host may get one).
    fn placeholder_in(&self, bytes: &[u8]) -> Option<&str> {
        self.credentials
            .iter()
            .find(|credential| {
                credential.placeholder().is_some_and(|placeholder| {
                    bytes
                        .windows(placeholder.len())
                        .any(|window| window == placeholder.as_bytes())
                })
            })
            .map(|credential| credential.name.as_str())
    }
}

/// Sandboxes by source address.
#[derive(Default)]
pub struct Registry {
    entries: RwLock<HashMap<IpAddr, Arc<Entry>>>,
}

impl Registry {
    pub fn add(
        &self,
        address: IpAddr,
        sandbox: &str,
        policy: Policy,
        max_connections: usize,
        interception: Option<Arc<Interception>>,
    ) {
        let entry = Arc::new(Entry {
            sandbox: sandbox.to_owned(),
            policy: RwLock::new(Arc::new(policy)),
            connections: Semaphore::new(max_connections),
            interception,
        });
        self.write().insert(address, entry);
    }

    pub fn remove(&self, address: IpAddr) {
        self.write().remove(&address);
    }

    /// Replaces a sandbox's policy; `false` when the address is not registered.
    pub fn set_policy(&self, address: IpAddr, policy: Policy) -> bool {
        let Some(entry) = self.get(address) else {
            return false;
        };
        *entry
            .policy
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(policy);
        true
    }

    pub fn get(&self, address: IpAddr) -> Option<Arc<Entry>> {
        self.entries
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&address)
            .cloned()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<IpAddr, Arc<Entry>>> {
        self.entries
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Entry {
    pub(crate) fn policy(&self) -> Arc<Policy> {
        Arc::clone(
            &self
                .policy
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }
}

/// How names are resolved: the system's resolver, or — for tests that need upstreams on
/// addresses they control — an explicit table. Either way every address then passes the
/// same SSRF guard.
#[derive(Debug, Clone)]
pub enum Resolver {
    System,
    Fixed(HashMap<String, Vec<IpAddr>>),
}

impl Resolver {
    pub(crate) async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
        match self {
            Resolver::System => Ok(tokio::net::lookup_host((host, port))
                .await?
                .map(|address| address.ip())
                .collect()),
            Resolver::Fixed(table) => table
                .get(host)
                .cloned()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such name")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "decision", content = "reason", rename_all = "snake_case")]
pub enum Decision {
    Allowed,
    /// Refused, and why (shown to the sandbox and in the flow log).
    Denied(String),
    /// Allowed, but the upstream could not be reached.
    Failed(String),
}

/// One connection through the proxy.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Flow {
    pub sandbox: String,
    pub host: String,
    pub port: u16,
    /// `connect`, `http` (explicit), `transparent-http`, `transparent-tls`, `https` or `dns`.
    pub mode: String,
    pub decision: Decision,
    /// Whether its TLS was opened (a credential, or placeholders to watch).
    pub intercepted: bool,
    /// Credentials injected into its requests (names).
    pub credentials: Vec<String>,
    /// The credential whose placeholder it tried to take to another host.
    pub leak: Option<String>,
    /// The address dialed, when one was.
    pub address: Option<SocketAddr>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration: Duration,
    pub started_at: std::time::SystemTime,
}

pub struct ProxyConfig {
    /// Addresses of this node (refused as upstreams, like internal ones).
    pub node_addresses: Vec<IpAddr>,
    pub connect_timeout: Duration,
    /// How long a sandbox may take to send a request head (or TLS handshake).
    pub head_timeout: Duration,
    /// How long a relayed connection may stay silent both ways.
    pub idle_timeout: Duration,
    /// Trust for upstream servers of intercepted connections.
    pub upstream_tls: Arc<rustls::ClientConfig>,
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
    config: ProxyConfig,
    flows: mpsc::Sender<Flow>,
}

/// What a request head asked for.
struct Target {
    mode: &'static str,
    host: String,
    port: u16,
    /// Plain HTTP: served request by request (the others are tunnels or TLS).
    plain: bool,
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
            config,
            flows,
        })
    }

    /// Serves a listener until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, kind: Listener) {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
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
        let Ok(_permit) = entry.connections.try_acquire() else {
            if kind != Listener::TransparentTls {
                let _ = deny(&mut stream, 429, "too many connections from this sandbox").await;
            }
            return;
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
        let mut flow = Flow {
            sandbox: entry.sandbox.clone(),
            host: target.host.clone(),
            port: target.port,
            mode: target.mode.to_owned(),
            decision: Decision::Allowed,
            intercepted: false,
            credentials: Vec::new(),
            leak: None,
            address: None,
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::ZERO,
            started_at: std::time::SystemTime::now(),
        };
        let interception = entry.interception.clone();
        // Plain HTTP is read, not opened: a placeholder in it goes nowhere, whatever the
        // host (credentials are only ever sent over TLS).
        let leaked = match &interception {
            Some(interception) if target.plain => {
                interception.placeholder_in(&buffer).map(str::to_owned)
            }
            _ => None,
        };
        let opened = match leaked {
            Some(name) => {
                flow.leak = Some(name.clone());
                Err(Decision::Denied(format!(
                    "the request carries the placeholder of credential `{name}`, which is only sent over HTTPS to its own hosts; blocked"
                )))
            }
            None => self.open(&entry, &target).await,
        };
        match opened {
            Err(Decision::Denied(why)) => {
                if kind != Listener::TransparentTls {
                    let _ = deny(&mut stream, 403, &why).await;
                }
                flow.decision = Decision::Denied(why);
            }
            Err(other) => {
                let why = match &other {
                    Decision::Failed(why) | Decision::Denied(why) => why.clone(),
                    Decision::Allowed => String::new(),
                };
                if kind != Listener::TransparentTls {
                    let _ = deny(&mut stream, 502, &why).await;
                }
                flow.decision = other;
            }
            Ok((mut upstream, address)) => {
                flow.address = Some(address);
                let intercept = !target.plain
                    && interception
                        .as_ref()
                        .is_some_and(|i| i.wants(&target.host, target.port));
                if let (true, Some(interception)) = (intercept, interception.clone()) {
                    let replay = if kind == Listener::Explicit {
                        let answered = stream
                            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                            .await
                            .is_ok();
                        if !answered {
                            return;
                        }
                        buffer[head_len..].to_vec()
                    } else {
                        std::mem::take(&mut buffer)
                    };
                    self.intercept(
                        Tap::new(stream, replay),
                        interception,
                        &target,
                        upstream,
                        &mut flow,
                    )
                    .await;
                } else if target.plain {
                    // The head read so far is replayed to the HTTP server.
                    self.plain(
                        Tap::new(stream, std::mem::take(&mut buffer)),
                        interception,
                        &target,
                        kind,
                        upstream,
                        &mut flow,
                    )
                    .await;
                } else {
                    let mut first = buffer.split_off(head_len);
                    let sent = match kind {
                        Listener::Explicit => {
                            stream
                                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                                .await
                                .is_ok()
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
                        let head_bytes = first.len();
                        let relayed =
                            relay::relay(&stream, &upstream, self.config.idle_timeout).await;
                        flow.bytes_up = relayed.forward + head_bytes as u64;
                        flow.bytes_down = relayed.backward;
                    }
                }
            }
        }
        flow.duration = started.elapsed();
        tracing::info!(
            sandbox = %flow.sandbox, host = %flow.host, port = flow.port, mode = flow.mode,
            decision = ?flow.decision, intercepted = flow.intercepted,
            credentials = ?flow.credentials, up = flow.bytes_up, down = flow.bytes_down,
            "egress"
        );
        let _ = self.flows.try_send(flow);
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
        match hello {
            Ok(Ok(Hello::Name(name))) if name != host => Err(format!(
                "the TLS server name {name} is not {host}, the host this tunnel was opened for"
            )),
            // The right name, no name, not TLS — or the client went quiet or away, which the
            // relay sees too.
            _ => Ok(()),
        }
    }

    /// Opens the sandbox's TLS with a certificate from its CA, the upstream's with the real
    /// one verified, and relays request by request: credentials injected, placeholders
    /// bound for other hosts stopped.
    async fn intercept(
        &self,
        stream: Tap<TcpStream>,
        interception: Arc<Interception>,
        target: &Target,
        upstream: TcpStream,
        flow: &mut Flow,
    ) {
        flow.intercepted = true;
        let counters = Arc::clone(&stream.counters);
        let server = match interception.authority.server_config(&target.host) {
            Ok(config) => config,
            Err(why) => {
                flow.decision = Decision::Failed(format!("no certificate for the host: {why}"));
                return;
            }
        };
        let accepted = tokio::time::timeout(
            self.config.head_timeout,
            tokio_rustls::TlsAcceptor::from(server).accept(stream),
        )
        .await;
        let Ok(Ok(downstream)) = accepted else {
            flow.decision = Decision::Failed(
                "the sandbox's TLS handshake failed (does its client trust the sandbox CA?)"
                    .to_owned(),
            );
            return;
        };
        let session = Session::new(
            Some(interception),
            true,
            false,
            target,
            flow,
            counters,
            self,
        );
        match self.upstream_tls(&target.host, upstream).await {
            Ok(sender) => *session.sender.lock().await = Some(sender),
            Err(why) => *session.problem.lock().unwrap_or_else(|p| p.into_inner()) = Some(why),
        }
        self.serve_session(session, downstream, flow).await;
    }

    /// Plain HTTP, request by request: each must name the connection's host, and no
    /// placeholder leaves in its head or body (credentials travel only over TLS). Upgrades
    /// (WebSocket) are passed on. Explicit proxy connections take one request each: the next
    /// one on them may be for another host.
    async fn plain(
        &self,
        stream: Tap<TcpStream>,
        interception: Option<Arc<Interception>>,
        target: &Target,
        kind: Listener,
        upstream: TcpStream,
        flow: &mut Flow,
    ) {
        let counters = Arc::clone(&stream.counters);
        let session = Session::new(
            interception,
            false,
            kind == Listener::Explicit,
            target,
            flow,
            counters,
            self,
        );
        match upstream_http(upstream, &target.host).await {
            Ok(sender) => *session.sender.lock().await = Some(sender),
            Err(why) => *session.problem.lock().unwrap_or_else(|p| p.into_inner()) = Some(why),
        }
        self.serve_session(session, stream, flow).await;
    }

    /// Serves a sandbox's HTTP connection through a session until it closes (and any
    /// upgraded connection it became has ended), then fills in its flow.
    async fn serve_session<S>(&self, session: Arc<Session>, downstream: S, flow: &mut Flow)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = {
            let session = Arc::clone(&session);
            hyper::service::service_fn(move |request| {
                let session = Arc::clone(&session);
                async move { Ok::<_, Infallible>(session.forward(request).await) }
            })
        };
        // A kept-alive connection that sends no new request within the idle timeout closes.
        // A client that shuts its side after the request (`printf … | nc`) still gets the
        // answer.
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .half_close(true)
            .header_read_timeout(self.config.idle_timeout)
            .serve_connection(TokioIo::new(downstream), service)
            .with_upgrades()
            .await;
        let upgraded = session
            .upgraded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(upgraded) = upgraded {
            let _ = upgraded.await;
        }
        flow.bytes_up = session.counters.up.load(Ordering::Relaxed);
        flow.bytes_down = session.counters.down.load(Ordering::Relaxed);
        flow.credentials = session
            .injected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        if let Some(why) = session
            .problem
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            flow.decision = Decision::Failed(why);
        }
    }

    /// TLS to the upstream, verified, and an HTTP/1.1 connection over it.
    async fn upstream_tls(
        &self,
        host: &str,
        upstream: TcpStream,
    ) -> Result<hyper::client::conn::http1::SendRequest<UpstreamBody>, String> {
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|_| format!("{host} is not a valid TLS server name"))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.config.upstream_tls));
        let tls = tokio::time::timeout(
            self.config.connect_timeout,
            connector.connect(name, upstream),
        )
        .await
        .map_err(|_| format!("{host} did not complete a TLS handshake in time"))?
        .map_err(|error| format!("TLS with {host} failed: {error}"))?;
        upstream_http(tls, host).await
    }

    /// Policy, resolution, the SSRF guard, then a connection to a checked address.
    async fn open(
        &self,
        entry: &Entry,
        target: &Target,
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
            if let Err(blocked) = ssrf::check(*address, &self.config.node_addresses) {
                return Err(Decision::Denied(format!(
                    "{} resolves to {address} ({}); refused",
                    target.host,
                    blocked.as_str()
                )));
            }
        }
        let address = SocketAddr::new(addresses[0], target.port);
        let stream = tokio::time::timeout(self.config.connect_timeout, TcpStream::connect(address))
            .await
            .map_err(|_| Decision::Failed(format!("{address} did not answer in time")))?
            .map_err(|error| Decision::Failed(format!("{address}: {error}")))?;
        let _ = stream.set_nodelay(true);
        Ok((stream, address))
    }
}

type Answer = hyper::Response<Either<Incoming, Full<Bytes>>>;
/// A request body as it goes upstream: untouched, or scanned for placeholders.
type UpstreamBody = Either<Incoming, ScannedBody>;

/// A request body passed through a [`BodyScan`]: placeholders swapped for this host's
/// values; one bound elsewhere ends the body with an error (the request is abandoned, the
/// upstream having received nothing of the placeholder) and is recorded in `leak`.
struct ScannedBody {
    inner: Incoming,
    scan: BodyScan,
    keeps_length: bool,
    finished: bool,
    trailers: Option<http::HeaderMap>,
    leak: Arc<Mutex<Option<String>>>,
}

impl hyper::body::Body for ScannedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use hyper::body::Frame;
        use std::task::Poll;
        let this = &mut *self;
        if this.finished {
            return Poll::Ready(
                this.trailers
                    .take()
                    .map(|trailers| Ok(Frame::trailers(trailers))),
            );
        }
        loop {
            let frame = match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(frame) => frame,
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => match this.scan.push(&data) {
                        Ok(ready) if ready.is_empty() => continue,
                        Ok(ready) => return Poll::Ready(Some(Ok(Frame::data(Bytes::from(ready))))),
                        Err(name) => {
                            let why = format!("the body carries the placeholder of `{name}`");
                            *this.leak.lock().unwrap_or_else(|p| p.into_inner()) = Some(name);
                            this.finished = true;
                            return Poll::Ready(Some(Err(why.into())));
                        }
                    },
                    Err(frame) => {
                        this.trailers = frame.into_trailers().ok();
                        this.finished = true;
                    }
                },
                Some(Err(error)) => return Poll::Ready(Some(Err(error.into()))),
                None => this.finished = true,
            }
            let rest = this.scan.finish();
            if !rest.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
            }
            return Poll::Ready(
                this.trailers
                    .take()
                    .map(|trailers| Ok(Frame::trailers(trailers))),
            );
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        if self.keeps_length {
            self.inner.size_hint()
        } else {
            hyper::body::SizeHint::default()
        }
    }
}

/// A sandbox's HTTP connection (intercepted TLS, or plain HTTP): its upstream and what its
/// requests used.
struct Session {
    sender: tokio::sync::Mutex<Option<hyper::client::conn::http1::SendRequest<UpstreamBody>>>,
    /// Why the upstream cannot be used (every request is answered 502 with it).
    problem: Mutex<Option<String>>,
    interception: Option<Arc<Interception>>,
    /// Over TLS: credentials bound to the host are added. In plain text none are, and any
    /// placeholder stops its request.
    tls: bool,
    /// Every answer closes the connection.
    one_request: bool,
    mode: String,
    host: String,
    port: u16,
    injected: Mutex<BTreeSet<String>>,
    flows: mpsc::Sender<Flow>,
    sandbox: String,
    address: Option<SocketAddr>,
    /// Bytes to and from the sandbox.
    counters: Arc<crate::stream::Counters>,
    idle_timeout: Duration,
    /// The relay of a connection upgraded (101) to another protocol.
    upgraded: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Session {
    fn new(
        interception: Option<Arc<Interception>>,
        tls: bool,
        one_request: bool,
        target: &Target,
        flow: &Flow,
        counters: Arc<crate::stream::Counters>,
        proxy: &Proxy,
    ) -> Arc<Session> {
        Arc::new(Session {
            sender: tokio::sync::Mutex::new(None),
            problem: Mutex::new(None),
            interception,
            tls,
            one_request,
            mode: flow.mode.clone(),
            host: target.host.clone(),
            port: target.port,
            injected: Mutex::new(BTreeSet::new()),
            flows: proxy.flows.clone(),
            sandbox: flow.sandbox.clone(),
            address: flow.address,
            counters,
            idle_timeout: proxy.config.idle_timeout,
            upgraded: Mutex::new(None),
        })
    }

    fn credentials(&self) -> &[Credential] {
        self.interception
            .as_deref()
            .map_or(&[], |interception| &interception.credentials)
    }
}

/// An HTTP/1.1 client connection over `io` (upgrades allowed), driven by a task of its own.
async fn upstream_http<I>(
    io: I,
    host: &str,
) -> Result<hyper::client::conn::http1::SendRequest<UpstreamBody>, String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|error| format!("HTTP with {host} failed: {error}"))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    Ok(sender)
}

/// Whether an upstream's answer ends its connection (so the sandbox's must end too).
fn closes<B>(response: &hyper::Response<B>) -> bool {
    let connection = response
        .headers()
        .get(http::header::CONNECTION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    connection.contains("close")
        || (response.version() == http::Version::HTTP_10 && !connection.contains("keep-alive"))
}

/// Relays an upgraded connection until both ends close or nothing moves for `idle`.
async fn relay_upgraded(
    downstream: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    counters: Arc<crate::stream::Counters>,
    idle: Duration,
) {
    let (Ok(downstream), Ok(upstream)) = tokio::join!(downstream, upstream) else {
        return;
    };
    let (mut downstream, mut upstream) = (TokioIo::new(downstream), TokioIo::new(upstream));
    let quiet = async {
        loop {
            let moved = |c: &crate::stream::Counters| {
                c.up.load(Ordering::Relaxed) + c.down.load(Ordering::Relaxed)
            };
            let before = moved(&counters);
            tokio::time::sleep(idle).await;
            if moved(&counters) == before {
                return;
            }
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut downstream, &mut upstream) => {}
        () = quiet => {}
    }
}

fn answer(status: u16, why: &str) -> Answer {
    let mut response = hyper::Response::new(Either::Right(Full::new(Bytes::from(format!(
        "SandBase egress: {why}\n"
    )))));
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl Session {
    /// One request of the sandbox's, answered by the upstream or by the proxy.
    async fn forward(&self, request: hyper::Request<Incoming>) -> Answer {
        let mut answer = self.exchange(request).await;
        if self.one_request && answer.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
            answer.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        answer
    }

    async fn exchange(&self, mut request: hyper::Request<Incoming>) -> Answer {
        let downstream_upgrade = request
            .headers()
            .contains_key(http::header::UPGRADE)
            .then(|| hyper::upgrade::on(&mut request));
        let (mut parts, body) = request.into_parts();
        // The names must agree: the request's host and port are the connection's.
        let authority = parts
            .uri
            .authority()
            .map(|authority| authority.as_str().to_owned())
            .or_else(|| {
                parts
                    .headers
                    .get(http::header::HOST)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned)
            });
        if let Some(authority) = authority {
            if authority.contains('@') {
                return answer(400, "credentials in the URL are not allowed");
            }
            let named = split_authority(&authority, self.port);
            let agrees = named
                .as_ref()
                .is_ok_and(|(host, port)| *host == self.host && *port == self.port);
            if !agrees {
                return answer(
                    421,
                    &format!(
                        "this connection is for {}:{}; a request for {authority} needs its own",
                        self.host, self.port
                    ),
                );
            }
        }
        // Proxy headers are for the proxy.
        let proxy_headers: Vec<http::HeaderName> = parts
            .headers
            .keys()
            .filter(|name| name.as_str().starts_with("proxy-"))
            .cloned()
            .collect();
        for name in proxy_headers {
            parts.headers.remove(name);
        }
        if let Some(authority) = parts.uri.authority() {
            if !parts.headers.contains_key(http::header::HOST) {
                match http::HeaderValue::from_str(authority.as_str()) {
                    Ok(host) => parts.headers.insert(http::header::HOST, host),
                    Err(_) => return answer(400, "bad request target"),
                };
            }
            let origin = parts
                .uri
                .path_and_query()
                .map_or("/", |origin| origin.as_str())
                .to_owned();
            match origin.parse() {
                Ok(uri) => parts.uri = uri,
                Err(_) => return answer(400, "bad request target"),
            }
        }
        let outcome = if self.tls {
            crate::credentials::apply(self.credentials(), &self.host, self.port, &mut parts)
        } else {
            match crate::credentials::placeholder_in_plain(self.credentials(), &parts) {
                Some(name) => Outcome::Leak(name),
                None => Outcome::Forward(Vec::new()),
            }
        };
        match outcome {
            Outcome::Leak(name) => return self.stop_leak(name),
            Outcome::Forward(names) => {
                if !names.is_empty() {
                    self.injected
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend(names);
                }
            }
        }
        if let Some(why) = self
            .problem
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return answer(502, &why);
        }
        let mut sender = self.sender.lock().await;
        let Some(sender) = sender.as_mut() else {
            return answer(502, "no upstream connection");
        };
        if sender.ready().await.is_err() {
            return answer(502, &format!("{} closed the connection", self.host));
        }
        // With placeholders about, the body is read on its way too.
        let leak = Arc::new(Mutex::new(None));
        let scan = if self.tls {
            BodyScan::new(self.credentials(), &self.host, self.port)
        } else {
            BodyScan::plain(self.credentials())
        };
        let body = match scan {
            None => Either::Left(body),
            Some(scan) => {
                let keeps_length = scan.keeps_length();
                if !keeps_length {
                    // Its length changes with the swap: sent chunked instead.
                    parts.headers.remove(http::header::CONTENT_LENGTH);
                }
                Either::Right(ScannedBody {
                    inner: body,
                    scan,
                    keeps_length,
                    finished: false,
                    trailers: None,
                    leak: Arc::clone(&leak),
                })
            }
        };
        let sent = sender
            .send_request(hyper::Request::from_parts(parts, body))
            .await;
        if let Some(name) = leak.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return self.stop_leak(name);
        }
        let mut response = match sent {
            Ok(response) => response,
            Err(error) => return answer(502, &format!("{}: {error}", self.host)),
        };
        if response.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
            let Some(downstream) = downstream_upgrade else {
                return answer(502, &format!("{} switched protocols unasked", self.host));
            };
            let upstream = hyper::upgrade::on(&mut response);
            let relay = tokio::spawn(relay_upgraded(
                downstream,
                upstream,
                Arc::clone(&self.counters),
                self.idle_timeout,
            ));
            *self.upgraded.lock().unwrap_or_else(|p| p.into_inner()) = Some(relay);
        } else if closes(&response) {
            response.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        response.map(Either::Left)
    }

    /// Answers 403 for a request carrying another host's placeholder, and records it.
    fn stop_leak(&self, name: String) -> Answer {
        let why = if self.tls {
            format!(
                "the request carries the placeholder of credential `{name}`, which is not for {}; blocked",
                self.host
            )
        } else {
            format!(
                "the request carries the placeholder of credential `{name}`, which is only sent over HTTPS to its own hosts; blocked"
            )
        };
        let _ = self.flows.try_send(Flow {
            sandbox: self.sandbox.clone(),
            host: self.host.clone(),
            port: self.port,
            mode: if self.tls {
                "https"
            } else {
                self.mode.as_str()
            }
            .to_owned(),
            decision: Decision::Denied(why.clone()),
            intercepted: self.tls,
            credentials: Vec::new(),
            leak: Some(name),
            address: self.address,
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::ZERO,
            started_at: std::time::SystemTime::now(),
        });
        answer(403, &why)
    }
}

/// Reads until a whole ClientHello record is in `buffer`.
async fn read_hello(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<Hello> {
    let mut chunk = [0u8; 4096];
    loop {
        match sni::parse(buffer) {
            Hello::Incomplete => {}
            other => return Ok(other),
        }
        if buffer.len() >= sni::MAX_RECORD {
            return Ok(Hello::NotTls);
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..read]);
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

/// Reads until the end of a request head; returns its length (bytes after it stay in
/// `buffer`).
async fn read_head(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(end + 4);
        }
        if buffer.len() >= MAX_HEAD {
            return Err(std::io::Error::other("request head too large"));
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// `host` or `host:port` (IPv6 literals in brackets); the default port when absent.
fn split_authority(authority: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{authority}` is not host:port"))?;
        let port = match after.strip_prefix(':') {
            Some(port) => port
                .parse()
                .map_err(|_| format!("bad port in `{authority}`"))?,
            None => default_port,
        };
        (host.to_owned(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (
                host.to_owned(),
                port.parse()
                    .map_err(|_| format!("bad port in `{authority}`"))?,
            ),
            None => (authority.to_owned(), default_port),
        }
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() || port == 0 {
        return Err(format!("`{authority}` is not host:port"));
    }
    if host.parse::<IpAddr>().is_ok() {
        return Err(format!(
            "{host}: IP addresses are not allowed, only host names the policy allows"
        ));
    }
    Ok((host, port))
}

/// What a request head asks for: on the explicit listener (`redirected` = `None`) a CONNECT
/// or an absolute-form request; redirected from port N, an origin-form request whose host is
/// its `Host` (which must not name another port).
fn parse_target(head: &[u8], redirected: Option<u16>) -> Result<Target, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err("malformed request".to_owned()),
    }
    let method = request.method.unwrap_or_default();
    let path = request.path.unwrap_or_default();
    let host_header = request
        .headers
        .iter()
        .find(|header| header.name.eq_ignore_ascii_case("host"))
        .and_then(|header| std::str::from_utf8(header.value).ok())
        .map(str::to_owned);
    if let Some(port) = redirected {
        if method == "CONNECT" || !path.starts_with('/') {
            return Err("expected an origin-form request (GET /path)".to_owned());
        }
        let authority = host_header.ok_or_else(|| "a Host header is required".to_owned())?;
        let (host, named_port) = split_authority(&authority, port)?;
        if named_port != port {
            return Err(format!(
                "the Host header names port {named_port}, the connection is to port {port}"
            ));
        }
        return Ok(Target {
            mode: "transparent-http",
            host,
            port,
            plain: true,
        });
    }
    if method == "CONNECT" {
        let (host, port) = split_authority(path, 443)?;
        if let Some(header) = host_header {
            let (named, _) = split_authority(&header, port)?;
            if named != host {
                return Err(format!(
                    "the Host header ({named}) does not match the CONNECT target ({host})"
                ));
            }
        }
        return Ok(Target {
            mode: "connect",
            host,
            port,
            plain: false,
        });
    }
    let rest = path
        .strip_prefix("http://")
        .ok_or_else(|| "only absolute http:// requests and CONNECT are proxied".to_owned())?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("credentials in the URL are not allowed".to_owned());
    }
    let (host, port) = split_authority(authority, 80)?;
    if let Some(header) = &host_header {
        let (named, _) = split_authority(header, port)?;
        if named != host {
            return Err(format!(
                "the Host header ({named}) does not match the request target ({host})"
            ));
        }
    }
    Ok(Target {
        mode: "http",
        host,
        port,
        plain: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirected_requests_are_named_by_their_host_header() {
        let get = parse_target(
            b"GET /x HTTP/1.1\r\nHost: Api.Example.com\r\nConnection: keep-alive\r\n\r\n",
            Some(80),
        )
        .unwrap();
        assert_eq!(
            (get.mode, get.host.as_str(), get.port),
            ("transparent-http", "api.example.com", 80)
        );
        assert!(get.plain);
        for bad in [
            &b"GET /x HTTP/1.1\r\n\r\n"[..],
            b"GET /x HTTP/1.1\r\nHost: api.example.com:8080\r\n\r\n",
            b"GET /x HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n",
            b"GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
            b"CONNECT api.example.com:443 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                parse_target(bad, Some(80)).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn targets_are_read_from_connect_and_absolute_requests() {
        let connect = parse_target(
            b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n",
            None,
        )
        .unwrap();
        assert_eq!(
            (connect.mode, connect.host.as_str(), connect.port),
            ("connect", "api.example.com", 443)
        );
        let get = parse_target(
            b"GET http://Example.org/a?b=1 HTTP/1.1\r\nHost: example.org\r\nProxy-Authorization: x\r\nConnection: keep-alive\r\n\r\n",
            None,
        )
        .unwrap();
        assert_eq!(
            (get.host.as_str(), get.port, get.plain),
            ("example.org", 80, true)
        );
        assert!(!connect.plain);
        for bad in [
            &b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n"[..],
            b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
            b"CONNECT a.example.com:443 HTTP/1.1\r\nHost: b.example.com\r\n\r\n",
            b"GET http://a.example.com/ HTTP/1.1\r\nHost: b.example.com\r\n\r\n",
            b"GET http://user:pw@a.example.com/ HTTP/1.1\r\n\r\n",
            b"GET /relative HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
            b"GET https://a.example.com/ HTTP/1.1\r\n\r\n",
            b"CONNECT a.example.com:0 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                parse_target(bad, None).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
