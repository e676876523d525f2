//! The egress proxy's explicit listener: HTTP `CONNECT host:port` (tunnels) and plain HTTP
//! requests in absolute form. A connection is accepted only from a registered sandbox
//! address; its host must be a name (not an IP literal) its policy allows, the `Host` header
//! must agree with the target, and the name is resolved here, every address checked by the
//! SSRF guard, and exactly a checked address dialed. Refusals are explained (403 naming the
//! host and why) and every connection ends as a [`Flow`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

use crate::policy::Policy;
use crate::ssrf;

/// Largest request head read from a sandbox.
const MAX_HEAD: usize = 16 * 1024;
/// Buffer of each direction of a relayed connection.
const COPY_BUFFER: usize = 256 * 1024;

/// A sandbox as the proxy knows it: who it is and what it may reach (changed at run time
/// with [`Registry::set_policy`]; effective for new connections).
pub struct Entry {
    pub sandbox: String,
    policy: RwLock<Arc<Policy>>,
    connections: Semaphore,
}

/// Sandboxes by source address.
#[derive(Default)]
pub struct Registry {
    entries: RwLock<HashMap<IpAddr, Arc<Entry>>>,
}

impl Registry {
    pub fn add(&self, address: IpAddr, sandbox: &str, policy: Policy, max_connections: usize) {
        let entry = Arc::new(Entry {
            sandbox: sandbox.to_owned(),
            policy: RwLock::new(Arc::new(policy)),
            connections: Semaphore::new(max_connections),
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
    fn policy(&self) -> Arc<Policy> {
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
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Refused, and why (shown to the sandbox and in the flow log).
    Denied(String),
    /// Allowed, but the upstream could not be reached.
    Failed(String),
}

/// One connection through the proxy.
#[derive(Debug, Clone)]
pub struct Flow {
    pub sandbox: String,
    pub host: String,
    pub port: u16,
    /// `connect` or `http`.
    pub mode: &'static str,
    pub decision: Decision,
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
    /// How long a sandbox may take to send a request head.
    pub head_timeout: Duration,
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
    /// For plain HTTP: the head rewritten for the upstream (origin form, no proxy headers,
    /// `Connection: close`).
    forward: Option<Vec<u8>>,
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

    /// Serves the explicit listener until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let proxy = Arc::clone(&self);
            tokio::spawn(async move { proxy.handle(stream, peer).await });
        }
    }

    async fn handle(&self, mut stream: TcpStream, peer: SocketAddr) {
        // Only sandboxes: anything else is closed without a word.
        let Some(entry) = self.registry.get(peer.ip()) else {
            return;
        };
        let started = Instant::now();
        // Small writes (a CONNECT answer, a request head) go out at once, not after Nagle's
        // delay meets the peer's delayed ACK.
        let _ = stream.set_nodelay(true);
        let Ok(_permit) = entry.connections.try_acquire() else {
            let _ = deny(&mut stream, 429, "too many connections from this sandbox").await;
            return;
        };
        let mut buffer = Vec::with_capacity(2048);
        let head = tokio::time::timeout(
            self.config.head_timeout,
            read_head(&mut stream, &mut buffer),
        )
        .await;
        let Ok(Ok(head_len)) = head else {
            return;
        };
        let target = match parse_target(&buffer[..head_len]) {
            Ok(target) => target,
            Err(why) => {
                let _ = deny(&mut stream, 400, &why).await;
                return;
            }
        };
        let mut flow = Flow {
            sandbox: entry.sandbox.clone(),
            host: target.host.clone(),
            port: target.port,
            mode: target.mode,
            decision: Decision::Allowed,
            address: None,
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::ZERO,
            started_at: std::time::SystemTime::now(),
        };
        match self.open(&entry, &target).await {
            Err(Decision::Denied(why)) => {
                let _ = deny(&mut stream, 403, &why).await;
                flow.decision = Decision::Denied(why);
            }
            Err(other) => {
                let why = match &other {
                    Decision::Failed(why) | Decision::Denied(why) => why.clone(),
                    Decision::Allowed => String::new(),
                };
                let _ = deny(&mut stream, 502, &why).await;
                flow.decision = other;
            }
            Ok((mut upstream, address)) => {
                flow.address = Some(address);
                let rest = &buffer[head_len..];
                let sent = match &target.forward {
                    Some(head) => {
                        upstream.write_all(head).await.is_ok()
                            && upstream.write_all(rest).await.is_ok()
                    }
                    None => {
                        stream
                            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                            .await
                            .is_ok()
                            && upstream.write_all(rest).await.is_ok()
                    }
                };
                if sent {
                    let head_bytes = target.forward.as_ref().map_or(0, Vec::len) + rest.len();
                    if let Ok((up, down)) = tokio::io::copy_bidirectional_with_sizes(
                        &mut stream,
                        &mut upstream,
                        COPY_BUFFER,
                        COPY_BUFFER,
                    )
                    .await
                    {
                        flow.bytes_up = up + head_bytes as u64;
                        flow.bytes_down = down;
                    }
                }
            }
        }
        flow.duration = started.elapsed();
        tracing::info!(
            sandbox = %flow.sandbox, host = %flow.host, port = flow.port, mode = flow.mode,
            decision = ?flow.decision, up = flow.bytes_up, down = flow.bytes_down,
            "egress"
        );
        let _ = self.flows.try_send(flow);
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

fn parse_target(head: &[u8]) -> Result<Target, String> {
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
            forward: None,
        });
    }
    let rest = path
        .strip_prefix("http://")
        .ok_or_else(|| "only absolute http:// requests and CONNECT are proxied".to_owned())?;
    let (authority, origin) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    };
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
    let mut forward = format!("{method} {origin} HTTP/1.1\r\n").into_bytes();
    let mut has_host = false;
    for header in request.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        has_host |= name == "host";
        forward.extend_from_slice(header.name.as_bytes());
        forward.extend_from_slice(b": ");
        forward.extend_from_slice(header.value);
        forward.extend_from_slice(b"\r\n");
    }
    if !has_host {
        forward.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    }
    forward.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Target {
        mode: "http",
        host,
        port,
        forward: Some(forward),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_read_from_connect_and_absolute_requests() {
        let connect = parse_target(
            b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            (connect.mode, connect.host.as_str(), connect.port),
            ("connect", "api.example.com", 443)
        );
        let get = parse_target(
            b"GET http://Example.org/a?b=1 HTTP/1.1\r\nHost: example.org\r\nProxy-Authorization: x\r\nConnection: keep-alive\r\n\r\n",
        )
        .unwrap();
        assert_eq!((get.host.as_str(), get.port), ("example.org", 80));
        let forward = String::from_utf8(get.forward.unwrap()).unwrap();
        assert!(forward.starts_with("GET /a?b=1 HTTP/1.1\r\n"), "{forward}");
        assert!(
            !forward.contains("Proxy-Authorization")
                && forward.ends_with("Connection: close\r\n\r\n")
        );
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
                parse_target(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
