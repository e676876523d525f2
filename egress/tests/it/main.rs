//! The egress proxy against a real upstream: an HTTP server in a network namespace this test
//! creates, joined to the host by a veth pair on a public-looking (documentation) address,
//! so the SSRF guard runs unweakened; names reach it through the proxy's explicit resolver
//! table. Needs root (network namespaces) and iproute2.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use sandbase_egress::Policy;
use sandbase_egress::proxy::{Decision, Flow, Proxy, ProxyConfig, Registry, Resolver};
use sandbase_egress::testing::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

mod store;

/// Sends `request` through the proxy and reads until the proxy closes.
async fn exchange(proxy: std::net::SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_lets_through_only_what_the_policy_allows_and_refuses_internal_addresses() {
    let upstream = Upstream::start();
    upstream.wait_ready().await;
    let public = IpAddr::V4(upstream.address);
    let resolver = Resolver::Fixed(HashMap::from([
        ("allowed.test.example".to_owned(), vec![public]),
        ("denied.test.example".to_owned(), vec![public]),
        (
            "loopback.test.example".to_owned(),
            vec!["127.0.0.1".parse().unwrap()],
        ),
        (
            "metadata.test.example".to_owned(),
            vec!["169.254.169.254".parse().unwrap()],
        ),
        (
            "mixed.test.example".to_owned(),
            vec![public, "10.0.0.5".parse().unwrap()],
        ),
        (
            "mapped.test.example".to_owned(),
            vec!["::ffff:127.0.0.1".parse().unwrap()],
        ),
        (
            "node.test.example".to_owned(),
            vec!["198.51.100.7".parse().unwrap()],
        ),
    ]));
    let registry = Arc::new(Registry::default());
    let sandbox: IpAddr = "127.0.0.1".parse().unwrap();
    let allow: Vec<String> = [
        "allowed.test.example",
        "loopback.test.example",
        "metadata.test.example",
        "mixed.test.example",
        "mapped.test.example",
        "node.test.example",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    registry.add(
        sandbox,
        "sbx-1",
        Policy::parse(&allow, &[]).unwrap(),
        8,
        None,
        None,
    );
    let (flows_tx, mut flows) = mpsc::channel::<Flow>(100);
    let proxy = Proxy::new(
        Arc::clone(&registry),
        resolver,
        ProxyConfig {
            node_addresses: vec!["198.51.100.7".parse().unwrap()],
            denied_networks: Vec::new(),
            connect_timeout: Duration::from_secs(3),
            head_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(30),
            upstream_tls: sandbase_egress::tls::upstream_config(None).unwrap(),
            max_connections: 256,
            store: None,
        },
        flows_tx,
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let serving = tokio::spawn(proxy.serve(listener, sandbase_egress::proxy::Listener::Explicit));

    // Plain HTTP to an allowed host: forwarded, proxy headers dropped.
    let answer = exchange(
        address,
        "GET http://allowed.test.example/hello?x=1 HTTP/1.1\r\nHost: allowed.test.example\r\nProxy-Authorization: Basic eA==\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("GET /hello?x=1 HTTP/1.1"), "{answer}");
    assert!(
        !answer.to_ascii_lowercase().contains("proxy-authorization"),
        "{answer}"
    );

    // CONNECT to an allowed host, then a request through the tunnel.
    let mut tunnel = TcpStream::connect(address).await.unwrap();
    tunnel
        .write_all(
            b"CONNECT allowed.test.example:80 HTTP/1.1\r\nHost: allowed.test.example:80\r\n\r\n",
        )
        .await
        .unwrap();
    let mut established = [0u8; 39];
    tunnel.read_exact(&mut established).await.unwrap();
    assert!(
        established.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&established)
    );
    tunnel
        .write_all(b"GET /through-the-tunnel HTTP/1.1\r\nHost: allowed.test.example\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tunnel.read_to_string(&mut answer).await.unwrap();
    assert!(answer.contains("GET /through-the-tunnel"), "{answer}");
    drop(tunnel);

    // Refused, each explained: not on the policy, internal addresses behind allowed names,
    // raw IPs, a Host header that disagrees.
    let refusals = [
        (
            "GET http://denied.test.example/ HTTP/1.1\r\nHost: denied.test.example\r\n\r\n",
            "403",
            "not allowed by this sandbox's egress policy",
        ),
        (
            "CONNECT denied.test.example:443 HTTP/1.1\r\n\r\n",
            "403",
            "not allowed",
        ),
        (
            "CONNECT allowed.test.example:8080 HTTP/1.1\r\n\r\n",
            "403",
            "not allowed",
        ),
        (
            "GET http://loopback.test.example/ HTTP/1.1\r\n\r\n",
            "403",
            "loopback address",
        ),
        (
            "CONNECT metadata.test.example:80 HTTP/1.1\r\n\r\n",
            "403",
            "cloud metadata address",
        ),
        (
            "CONNECT mixed.test.example:80 HTTP/1.1\r\n\r\n",
            "403",
            "private address",
        ),
        (
            "CONNECT mapped.test.example:80 HTTP/1.1\r\n\r\n",
            "403",
            "IPv4 embedded in IPv6",
        ),
        (
            "CONNECT node.test.example:80 HTTP/1.1\r\n\r\n",
            "403",
            "an address of this node",
        ),
        (
            "CONNECT 203.0.113.2:80 HTTP/1.1\r\n\r\n",
            "400",
            "IP addresses are not allowed",
        ),
        (
            "GET http://allowed.test.example/ HTTP/1.1\r\nHost: denied.test.example\r\n\r\n",
            "400",
            "does not match",
        ),
    ];
    for (request, status, why) in refusals {
        let answer = exchange(address, request).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{request}: {answer}"
        );
        assert!(answer.contains(why), "{request}: {answer}");
    }

    // The flow log: the two allowed connections with their bytes, and the policy refusals.
    let mut seen = Vec::new();
    while let Ok(Some(flow)) = tokio::time::timeout(Duration::from_millis(500), flows.recv()).await
    {
        seen.push(flow);
    }
    let allowed: Vec<&Flow> = seen
        .iter()
        .filter(|f| f.decision == Decision::Allowed)
        .collect();
    assert_eq!(allowed.len(), 2, "{seen:?}");
    assert!(
        allowed
            .iter()
            .all(|f| f.bytes_down > 100 && f.bytes_up > 20 && f.sandbox == "sbx-1")
    );
    assert_eq!(allowed[1].mode, "connect");
    assert_eq!(
        seen.iter()
            .filter(|f| matches!(f.decision, Decision::Denied(_)))
            .count(),
        8,
        "{seen:?}"
    );

    // TLS in a CONNECT tunnel must name the tunnel's host: the same upstream address (its
    // certificate is good for every *.test.example name) answers for the right name, and a
    // tunnel opened for an allowed name carrying a ClientHello for a denied one (fronting)
    // is closed before the upstream sees it.
    let client = tokio_rustls::TlsConnector::from(
        sandbase_egress::tls::upstream_config(Some(upstream.ca_pem.as_bytes())).unwrap(),
    );
    for (sni, works) in [
        ("allowed.test.example", true),
        ("denied.test.example", false),
    ] {
        let mut tunnel = TcpStream::connect(address).await.unwrap();
        tunnel
            .write_all(b"CONNECT allowed.test.example:443 HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut established = [0u8; 39];
        tunnel.read_exact(&mut established).await.unwrap();
        assert!(established.starts_with(b"HTTP/1.1 200"));
        let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
        let tls = tokio::time::timeout(Duration::from_secs(10), client.connect(name, tunnel))
            .await
            .unwrap();
        match tls {
            Ok(mut tls) => {
                assert!(
                    works,
                    "TLS for {sni} went through a tunnel for another host"
                );
                tls.write_all(
                    b"GET /tls HTTP/1.1\r\nHost: allowed.test.example\r\nConnection: close\r\n\r\n",
                )
                .await
                .unwrap();
                let mut answer = Vec::new();
                let _ = tls.read_to_end(&mut answer).await;
                let answer = String::from_utf8_lossy(&answer);
                assert!(answer.contains("GET /tls HTTP/1.1"), "{answer}");
            }
            Err(error) => assert!(!works, "{sni}: {error}"),
        }
    }
    let mut refused = None;
    while let Ok(Some(flow)) = tokio::time::timeout(Duration::from_millis(500), flows.recv()).await
    {
        if let Decision::Denied(why) = &flow.decision {
            refused = Some(why.clone());
        }
    }
    let refused = refused.expect("the fronted tunnel is a denied flow");
    assert!(
        refused.contains("TLS server name denied.test.example is not allowed.test.example"),
        "{refused}"
    );
    assert!(
        !upstream.requests().contains("denied.test.example"),
        "{}",
        upstream.requests()
    );

    // A policy change applies to the next connection.
    assert!(registry.set_policy(sandbox, Policy::default()));
    let answer = exchange(
        address,
        "GET http://allowed.test.example/ HTTP/1.1\r\nHost: allowed.test.example\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains("allowed: nothing"),
        "{answer}"
    );

    // An address that is not a sandbox's gets nothing at all.
    registry.remove(sandbox);
    let answer = exchange(
        address,
        "GET http://allowed.test.example/ HTTP/1.1\r\nHost: allowed.test.example\r\n\r\n",
    )
    .await;
    assert_eq!(answer, "");
    serving.abort();
}

/// A connection to `proxy` from `source` (the proxy knows sandboxes by source address).
async fn connect_from(source: &str, proxy: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::new(source.parse().unwrap(), 0))
        .unwrap();
    socket.connect(proxy).await.unwrap()
}

/// Reads one response (head and a `Content-Length` body) from a kept-alive connection.
async fn response<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut buffer = Vec::new();
    let mut byte = [0u8; 1];
    while !buffer.ends_with(b"\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte))
            .await
            .expect("a response in time")
            .unwrap();
        assert_eq!(
            read,
            1,
            "closed mid-head: {}",
            String::from_utf8_lossy(&buffer)
        );
        buffer.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buffer).into_owned();
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    head + &String::from_utf8_lossy(&body)
}

/// Reads until the proxy closes, which it must do within 10 s.
async fn until_closed<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// Switches `stream` to the upstream's echo protocol and checks bytes come back.
async fn echoes<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    head: &str,
) {
    stream.write_all(head.as_bytes()).await.unwrap();
    let switched = response(stream).await;
    assert!(switched.starts_with("HTTP/1.1 101"), "{switched}");
    for message in [&b"ping"[..], &[7u8; 100_000][..]] {
        stream.write_all(message).await.unwrap();
        let mut echoed = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut echoed))
            .await
            .expect("echo in time")
            .unwrap();
        assert!(echoed == message, "the upgraded connection echoes");
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test(flavor = "multi_thread")]
async fn plain_http_is_checked_request_by_request_and_upgrades_pass_through() {
    use sandbase_egress::credentials::{Credential, Injection};
    use sandbase_egress::proxy::{Interception, Listener};

    let upstream = Upstream::start();
    upstream.wait_ready().await;
    let public = IpAddr::V4(upstream.address);
    let resolver = Resolver::Fixed(HashMap::from([
        ("allowed.test.example".to_owned(), vec![public]),
        ("other.test.example".to_owned(), vec![public]),
    ]));
    let policy = Policy::parse(
        &[
            "allowed.test.example".to_owned(),
            "other.test.example".to_owned(),
        ],
        &[],
    )
    .unwrap();
    let registry = Arc::new(Registry::default());
    registry.add(
        "127.0.0.1".parse().unwrap(),
        "sbx-plain",
        policy.clone(),
        8,
        None,
        None,
    );
    // A second sandbox holds a placeholder bound to allowed.test.example.
    let placeholder = "ghp_PLACEHOLDER00000000000000000".to_owned();
    let authority = sandbase_egress::tls::Authority::generate("sbx-secrets").unwrap();
    let sandbox_ca = authority.certificate_pem();
    registry.add(
        "127.0.0.2".parse().unwrap(),
        "sbx-secrets",
        policy,
        8,
        Some(Arc::new(Interception {
            credentials: vec![Credential::new(
                "github".to_owned(),
                vec![sandbase_egress::HostPattern::parse("allowed.test.example").unwrap()],
                Injection::Placeholder {
                    env: "GITHUB_TOKEN".to_owned(),
                    placeholder: placeholder.clone(),
                    in_body: true,
                    in_url: true,
                    paths: vec!["/*".to_owned()],
                    headers: sandbase_egress::credentials::default_placeholder_headers(),
                },
                zeroize::Zeroizing::new("ghp_theRealValue0000000000000000".to_owned()),
            )],
            authority,
        })),
        None,
    );
    let (flows_tx, mut flows) = mpsc::channel::<Flow>(100);
    let proxy = Proxy::new(
        registry,
        resolver,
        ProxyConfig {
            node_addresses: Vec::new(),
            denied_networks: Vec::new(),
            connect_timeout: Duration::from_secs(3),
            head_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(30),
            upstream_tls: sandbase_egress::tls::upstream_config(Some(upstream.ca_pem.as_bytes()))
                .unwrap(),
            max_connections: 256,
            store: None,
        },
        flows_tx,
    );
    let mut listeners = Vec::new();
    for kind in [Listener::Explicit, Listener::TransparentHttp] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listeners.push(listener.local_addr().unwrap());
        tokio::spawn(Arc::clone(&proxy).serve(listener, kind));
    }
    let (explicit, transparent) = (listeners[0], listeners[1]);

    // Port 80 redirected: one connection carries several requests for its host; a request
    // for another host on it (fronting on a shared address, even an allowed one) is refused
    // and never reaches the upstream.
    let mut connection = connect_from("127.0.0.1", transparent).await;
    for path in ["/kept-1", "/kept-2"] {
        connection
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: allowed.test.example\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let answer = response(&mut connection).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains(&format!("GET {path} HTTP/1.1")), "{answer}");
    }
    connection
        .write_all(b"GET /fronted HTTP/1.1\r\nHost: other.test.example\r\n\r\n")
        .await
        .unwrap();
    let answer = response(&mut connection).await;
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    assert!(
        answer.contains("this connection is for allowed.test.example:80"),
        "{answer}"
    );
    drop(connection);
    // Two Host headers (which one would the upstream believe?) and none at all: refused.
    for head in [
        "GET /twice HTTP/1.1\r\nHost: allowed.test.example\r\nHost: other.test.example\r\n\r\n",
        "GET /none HTTP/1.1\r\n\r\n",
    ] {
        let mut connection = connect_from("127.0.0.1", explicit).await;
        connection.write_all(head.as_bytes()).await.unwrap();
        let answer = until_closed(&mut connection).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{head}: {answer}");
    }
    // In absolute form a Host naming another host than the authority is refused.
    let mut connection = connect_from("127.0.0.1", explicit).await;
    connection
        .write_all(b"GET http://allowed.test.example/absolute HTTP/1.1\r\nHost: other.test.example\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut connection).await;
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("does not match"),
        "{answer}"
    );
    drop(connection);

    // Explicit proxy: proxy headers stay with the proxy, and the connection ends with the
    // answer (its next request could be for any host).
    let mut connection = connect_from("127.0.0.1", explicit).await;
    connection
        .write_all(b"GET http://allowed.test.example/explicit HTTP/1.1\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut connection).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("GET /explicit HTTP/1.1"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("host: allowed.test.example"),
        "{answer}"
    );
    assert!(!answer.to_ascii_lowercase().contains("proxy-"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );

    // Placeholders never travel in plain text, not even to their own host: in a second
    // request on a kept-alive connection, and in a body.
    let mut connection = connect_from("127.0.0.2", transparent).await;
    connection
        .write_all(b"GET /fine HTTP/1.1\r\nHost: allowed.test.example\r\n\r\n")
        .await
        .unwrap();
    assert!(response(&mut connection).await.starts_with("HTTP/1.1 200"));
    connection
        .write_all(
            format!("GET /leak?t={placeholder} HTTP/1.1\r\nHost: allowed.test.example\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let answer = response(&mut connection).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("only sent over HTTPS"), "{answer}");
    drop(connection);
    // Far into the body, past what is read with the head: the body's own scan stops it.
    let body = format!(
        "{{\"padding\": \"{}\", \"token\": \"{placeholder}\"}}",
        "x".repeat(100_000)
    );
    let mut connection = connect_from("127.0.0.2", explicit).await;
    connection
        .write_all(
            format!(
                "POST http://allowed.test.example/post-leak HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let answer = until_closed(&mut connection).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("`github`"), "{answer}");

    // Upgrades pass: plain through the explicit proxy, and inside intercepted TLS, where the
    // upgrade request's placeholder header is swapped like any other.
    let mut connection = connect_from("127.0.0.1", explicit).await;
    echoes(
        &mut connection,
        "GET http://allowed.test.example/upgrade HTTP/1.1\r\nHost: allowed.test.example\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    )
    .await;
    drop(connection);
    let mut tunnel = connect_from("127.0.0.2", explicit).await;
    tunnel
        .write_all(b"CONNECT allowed.test.example:443 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    assert!(response(&mut tunnel).await.starts_with("HTTP/1.1 200"));
    let client = tokio_rustls::TlsConnector::from(
        sandbase_egress::tls::upstream_config(Some(sandbox_ca.as_bytes())).unwrap(),
    );
    let name = rustls::pki_types::ServerName::try_from("allowed.test.example").unwrap();
    let mut tls = client.connect(name, tunnel).await.unwrap();
    echoes(
        &mut tls,
        &format!("GET /upgrade HTTP/1.1\r\nHost: allowed.test.example\r\nAuthorization: token {placeholder}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"),
    )
    .await;
    drop(tls);

    let requests = upstream.requests();
    assert!(requests.contains("GET /kept-2"), "{requests}");
    assert!(!requests.contains("/fronted"), "{requests}");
    assert!(!requests.contains("/leak"), "{requests}");
    assert!(!requests.contains(&placeholder), "{requests}");
    assert!(
        requests
            .to_ascii_lowercase()
            .contains("authorization: token ghp_therealvalue0000000000000000"),
        "{requests}"
    );
    assert_eq!(requests.matches("GET /upgrade").count(), 2, "{requests}");

    // The flow log: both leaks, named; the upgraded connections with their bytes.
    let mut seen = Vec::new();
    while let Ok(Some(flow)) = tokio::time::timeout(Duration::from_secs(2), flows.recv()).await {
        seen.push(flow);
    }
    let leaks = seen
        .iter()
        .filter(|f| {
            f.leak.as_deref() == Some("github") && matches!(f.decision, Decision::Denied(_))
        })
        .count();
    assert_eq!(leaks, 2, "{seen:?}");
    let upgraded: Vec<&Flow> = seen
        .iter()
        .filter(|f| {
            f.decision == Decision::Allowed && f.bytes_up > 100_000 && f.bytes_down > 100_000
        })
        .collect();
    assert_eq!(upgraded.len(), 2, "{seen:?}");
    assert!(
        upgraded
            .iter()
            .any(|f| f.intercepted && f.credentials == ["github"]),
        "{seen:?}"
    );
}
