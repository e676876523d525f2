//! The egress proxy against a direct connection, in one run.
//!
//! An upstream HTTP server (in this process) listens on a documentation address on a veth
//! interface the benchmark creates (and removes), so the proxy's SSRF guard runs unweakened; the proxy
//! resolves its name through an explicit table. Two measures, each against the same request
//! made directly:
//! - added latency: BENCH_REQUESTS (1 000) small requests, each a new connection — through a
//!   CONNECT tunnel (connect, CONNECT, 200, GET, answer) vs straight to the upstream;
//! - throughput: BENCH_BYTES (1 GiB) downloaded through a tunnel vs directly (five of each,
//!   alternating, the medians compared);
//! - interception: BENCH_REQUESTS small HTTPS requests, each a new connection, to a host with
//!   a credential bound (CONNECT, TLS with the sandbox's CA — its leaf certificate cached
//!   after the first —, the upstream's TLS verified, the header injected) vs HTTPS straight to
//!   the upstream.
//!
//! Needs root and iproute2: `cargo bench -p sandbase-egress --bench proxy`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbase_egress::Policy;
use sandbase_egress::proxy::{Proxy, ProxyConfig, Registry, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LINK: &str = "sbbench0";
const PEER: &str = "sbbench1";
const ADDRESS: &str = "203.0.113.201";
const NAME: &str = "bench.test.example";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .map(|status| status.success())
        .unwrap_or(false)
}

/// A listening socket, to be served on another thread's runtime.
fn listen(address: SocketAddr) -> std::net::TcpListener {
    let listener = std::net::TcpListener::bind(address).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    listener
}

/// CPU time (user + system) a thread of this process has used, from /proc.
fn thread_cpu(tid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("stat");
    // After the command name in parentheses: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("stat") + 2..]
        .split_whitespace()
        .collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// Runs a task on a thread with a single-threaded runtime of its own; its thread id.
fn own_thread<F, Fut>(make: F) -> i32
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (tid_sender, tid) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tid_sender.send(rustix::thread::gettid().as_raw_nonzero().get());
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(make());
    });
    tid.recv().expect("thread id")
}

/// Answers `GET /small` with two bytes and `GET /big?N` with N bytes, keep-alive.
async fn upstream(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve(stream));
    }
}

/// [`upstream`] over TLS.
async fn upstream_tls(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        // Like any server answering small requests: no Nagle delay on the answer's records.
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            if let Ok(stream) = acceptor.accept(stream).await {
                serve(stream).await;
            }
        });
    }
}

async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut stream: S) {
    {
        {
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let end = loop {
                    if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end + 4;
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => buffer.extend_from_slice(&chunk[..read]),
                    }
                };
                let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
                buffer.drain(..end);
                let size: u64 = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|path| path.strip_prefix("/big?"))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(2);
                let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n");
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
                let block = vec![b'x'; 256 * 1024];
                let mut left = size;
                while left > 0 {
                    let n = left.min(block.len() as u64) as usize;
                    if stream.write_all(&block[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
                if stream.flush().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Sends a GET on `stream` and reads the answer's body to its end.
async fn get<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    path: &str,
) -> u64 {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: {NAME}\r\n\r\n").as_bytes())
        .await
        .expect("send");
    stream.flush().await.expect("send");
    let mut buffer = Vec::new();
    let mut chunk = vec![0u8; 256 * 1024];
    let (end, length) = loop {
        let read = stream.read(&mut chunk).await.expect("read");
        assert!(read > 0, "closed early");
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
            let length: u64 = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .and_then(|n| n.trim().parse().ok())
                .expect("a length");
            break (end + 4, length);
        }
    };
    let mut received = (buffer.len() - end) as u64;
    while received < length {
        let read = stream.read(&mut chunk).await.expect("read");
        assert!(read > 0, "closed early");
        received += read as u64;
    }
    received
}

async fn tunnel(proxy: SocketAddr) -> TcpStream {
    tunnel_to(proxy, 80).await
}

async fn tunnel_to(proxy: SocketAddr, port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.expect("proxy");
    stream
        .write_all(
            format!("CONNECT {NAME}:{port} HTTP/1.1\r\nHost: {NAME}:{port}\r\n\r\n").as_bytes(),
        )
        .await
        .expect("connect");
    let mut answer = [0u8; 39];
    stream.read_exact(&mut answer).await.expect("established");
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    stream
}

/// The upstream's CA (PEM) and a TLS acceptor with a certificate for [`NAME`] it signed.
fn upstream_certificate() -> (String, tokio_rustls::TlsAcceptor) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca");
    let key = KeyPair::generate().expect("key");
    let leaf = CertificateParams::new(vec![NAME.to_owned()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("leaf");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone(), ca.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .expect("server config");
    (ca.pem(), tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// A TLS client trusting only `ca_pem`.
fn connector(ca_pem: &str) -> tokio_rustls::TlsConnector {
    tokio_rustls::TlsConnector::from(
        sandbase_egress::tls::upstream_config(Some(ca_pem.as_bytes())).expect("client config"),
    )
}

fn percentile(samples: &mut [Duration], fraction: f64) -> f64 {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * fraction).round() as usize;
    samples[index].as_secs_f64() * 1000.0
}

#[allow(
    clippy::too_many_lines,
    reason = "a benchmark's scenario, measured and reported in one place"
)]
fn main() {
    let requests = env_number("BENCH_REQUESTS", 1000);
    let bytes = env_number("BENCH_BYTES", 1 << 30);
    // A link left by an interrupted run; usually there is none, which is not worth a message.
    let _ = Command::new("ip")
        .args(["link", "del", LINK])
        .stderr(Stdio::null())
        .status();
    assert!(
        ip(&["link", "add", LINK, "type", "veth", "peer", "name", PEER])
            && ip(&["addr", "add", &format!("{ADDRESS}/32"), "dev", LINK])
            && ip(&["link", "set", LINK, "up"])
            && ip(&["link", "set", PEER, "up"]),
        "creating the benchmark's interface (root and iproute2 needed)"
    );
    // Client, upstream and proxy each on a thread with a runtime of its own, as the separate
    // processes they are in production.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    runtime.block_on(async move {
        let address: IpAddr = ADDRESS.parse().expect("address");
        let upstream_listener = listen(SocketAddr::new(address, 80));
        let (upstream_ca, acceptor) = upstream_certificate();
        let tls_listener = listen(SocketAddr::new(address, 443));
        let _ = own_thread(move || async move {
            tokio::spawn(upstream_tls(
                TcpListener::from_std(tls_listener).expect("listener"),
                acceptor,
            ));
            upstream(TcpListener::from_std(upstream_listener).expect("listener")).await;
        });
        let registry = Arc::new(Registry::default());
        // Latency is measured over thousands of new connections from one source: the
        // per-sandbox connection rate (a guard against floods) is lifted for it.
        registry.set_connection_rate(1e9, 1e9);
        registry.add(
            "127.0.0.1".parse().expect("loopback"),
            "bench",
            Policy::parse(&[NAME.to_owned()], &[]).expect("policy"),
            1024,
            None, None,
        );
        // The interception case comes from another loopback address (a sandbox of its own).
        let authority = sandbase_egress::tls::Authority::generate("bench").expect("CA");
        let sandbox_ca = authority.certificate_pem();
        registry.add(
            "127.0.0.2".parse().expect("loopback"),
            "bench-intercepted",
            Policy::parse(&[NAME.to_owned()], &[]).expect("policy"),
            1024,
            Some(Arc::new(sandbase_egress::proxy::Interception {
                credentials: vec![sandbase_egress::credentials::Credential::new(
                    "bench".to_owned(),
                    vec![sandbase_egress::HostPattern::parse(NAME).expect("pattern")],
                    sandbase_egress::credentials::Injection::Header {
                        name: http::header::AUTHORIZATION,
                        format: "Bearer {value}".to_owned(),
                    },
                    zeroize::Zeroizing::new("bench-secret-value".to_owned()),
                )],
                authority,
            })), None,
        );
        let (flows, mut drain) = tokio::sync::mpsc::channel(1024);
        let proxy = Proxy::new(
            registry,
            Resolver::Fixed(HashMap::from([(NAME.to_owned(), vec![address])])),
            ProxyConfig {
                node_addresses: Vec::new(),
                denied_networks: Vec::new(),
                connect_timeout: Duration::from_secs(5),
                head_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(30),
                upstream_tls: sandbase_egress::tls::upstream_config(Some(upstream_ca.as_bytes()))
                    .expect("trust"),
                max_connections: 4096,
                store: None,
            },
            flows,
        );
        let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0)));
        let proxy_address = listener.local_addr().expect("address");
        let proxy_thread = own_thread(move || async move {
            tokio::spawn(async move { while drain.recv().await.is_some() {} });
            let listener = TcpListener::from_std(listener).expect("listener");
            proxy
                .serve(listener, sandbase_egress::proxy::Listener::Explicit)
                .await;
        });
        let direct_address = SocketAddr::new(address, 80);

        // Latency: direct and tunnelled requests alternate, each on a new connection.
        let mut direct = Vec::new();
        let mut tunnelled = Vec::new();
        for _ in 0..requests {
            let started = Instant::now();
            let mut stream = TcpStream::connect(direct_address).await.expect("direct");
            get(&mut stream, "/small").await;
            direct.push(started.elapsed());
            let started = Instant::now();
            let mut stream = tunnel(proxy_address).await;
            get(&mut stream, "/small").await;
            tunnelled.push(started.elapsed());
        }
        let (d50, d99) = (percentile(&mut direct, 0.5), percentile(&mut direct, 0.99));
        let (t50, t99) = (
            percentile(&mut tunnelled, 0.5),
            percentile(&mut tunnelled, 0.99),
        );
        println!("## {requests} small requests, a new connection each");
        println!("direct:          p50 {d50:.3} ms  p99 {d99:.3} ms");
        println!(
            "through CONNECT: p50 {t50:.3} ms  p99 {t99:.3} ms → added p50 {:.3} ms, p99 {:.3} ms",
            t50 - d50,
            t99 - d99
        );

        // Plain HTTP through the explicit proxy (served request by request, checked per
        // request) against the same request straight to the upstream.
        let (mut direct, mut plain) = (Vec::new(), Vec::new());
        let absolute = format!("http://{NAME}/small");
        for _ in 0..requests {
            let started = Instant::now();
            let mut stream = TcpStream::connect(direct_address).await.expect("direct");
            get(&mut stream, "/small").await;
            direct.push(started.elapsed());
            let started = Instant::now();
            let mut stream = TcpStream::connect(proxy_address).await.expect("proxy");
            let _ = stream.set_nodelay(true);
            get(&mut stream, &absolute).await;
            plain.push(started.elapsed());
        }
        let (d50, d99) = (percentile(&mut direct, 0.5), percentile(&mut direct, 0.99));
        let (p50, p99) = (percentile(&mut plain, 0.5), percentile(&mut plain, 0.99));
        println!("## {requests} plain HTTP requests, a new connection each");
        println!("direct:          p50 {d50:.3} ms  p99 {d99:.3} ms");
        println!(
            "through the proxy: p50 {p50:.3} ms  p99 {p99:.3} ms → added p50 {:.3} ms, p99 {:.3} ms",
            p50 - d50,
            p99 - d99
        );

        // Throughput: five downloads each way, alternating; the median of each.
        let path = format!("/big?{bytes}");
        let (mut direct_runs, mut tunnel_runs) = (Vec::new(), Vec::new());
        let mut proxy_cpu = Duration::ZERO;
        for _ in 0..5 {
            let started = Instant::now();
            let mut stream = TcpStream::connect(direct_address).await.expect("direct");
            let received = get(&mut stream, &path).await;
            direct_runs.push(started.elapsed());
            let started = Instant::now();
            let cpu = thread_cpu(proxy_thread);
            let mut stream = tunnel(proxy_address).await;
            let through = get(&mut stream, &path).await;
            tunnel_runs.push(started.elapsed());
            proxy_cpu += thread_cpu(proxy_thread) - cpu;
            assert_eq!((received, through), (bytes, bytes));
        }
        direct_runs.sort();
        tunnel_runs.sort();
        let (direct_took, tunnel_took) = (direct_runs[2], tunnel_runs[2]);

        let rate = |took: Duration| bytes as f64 / took.as_secs_f64() / (1 << 20) as f64;
        println!("## {} MiB in one download (median of five)", bytes >> 20);
        println!("direct:          {:.0} MiB/s", rate(direct_took));
        println!(
            "through CONNECT: {:.0} MiB/s → {:.2} of direct",
            rate(tunnel_took),
            direct_took.as_secs_f64() / tunnel_took.as_secs_f64()
        );
        let relayed_gib = (5 * bytes) as f64 / (1u64 << 30) as f64;
        println!(
            "the proxy's CPU time: {:.0} ms per GiB relayed (its thread's user + system time)",
            proxy_cpu.as_secs_f64() * 1000.0 / relayed_gib
        );

        // Interception: a new connection each, both ways.
        let direct_tls = connector(&upstream_ca);
        let sandbox_tls = connector(&sandbox_ca);
        let name = rustls::pki_types::ServerName::try_from(NAME).expect("name");
        let (mut direct, mut intercepted) = (Vec::new(), Vec::new());
        for _ in 0..requests {
            let started = Instant::now();
            let stream = TcpStream::connect(SocketAddr::new(address, 443))
                .await
                .expect("direct");
            let _ = stream.set_nodelay(true);
            let mut stream = direct_tls
                .connect(name.clone(), stream)
                .await
                .expect("direct TLS");
            get(&mut stream, "/small").await;
            direct.push(started.elapsed());
            let started = Instant::now();
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket
                .bind("127.0.0.2:0".parse().expect("address"))
                .expect("bind");
            let mut stream = socket.connect(proxy_address).await.expect("proxy");
            let _ = stream.set_nodelay(true);
            stream
                .write_all(
                    format!("CONNECT {NAME}:443 HTTP/1.1\r\nHost: {NAME}:443\r\n\r\n").as_bytes(),
                )
                .await
                .expect("connect");
            let mut answer = [0u8; 39];
            stream.read_exact(&mut answer).await.expect("established");
            let mut stream = sandbox_tls
                .connect(name.clone(), stream)
                .await
                .expect("intercepted TLS");
            get(&mut stream, "/small").await;
            intercepted.push(started.elapsed());
        }
        let (d50, d99) = (percentile(&mut direct, 0.5), percentile(&mut direct, 0.99));
        let (i50, i99) = (
            percentile(&mut intercepted, 0.5),
            percentile(&mut intercepted, 0.99),
        );
        println!("## {requests} HTTPS requests with header injection, a new connection each");
        println!("direct:          p50 {d50:.3} ms  p99 {d99:.3} ms");
        println!(
            "intercepted:     p50 {i50:.3} ms  p99 {i99:.3} ms → added p50 {:.3} ms, p99 {:.3} ms",
            i50 - d50,
            i99 - d99
        );
    });
    let _ = ip(&["link", "del", LINK]);
}
