//! The store host: a sandbox with store access reaches the gateway through its proxy with its
//! store credential put in place of whatever it sent; a sandbox without it, other paths and
//! TLS to the name are refused, and the flow log says what happened.

use std::sync::Arc;
use std::time::Duration;

use sandbase_egress::Policy;
use sandbase_egress::process::StoreUpstream;
use sandbase_egress::proxy::{Decision, Flow, Proxy, ProxyConfig, Registry, Resolver, StoreRoute};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::{connect_from, response, until_closed};

const TOKEN: &str = "sbs_the-sandbox-store-credential";

/// A stand-in gateway answering every request with its head, on a kept-alive connection.
async fn echoing_gateway() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                loop {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let answer =
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", head.len());
                    if stream.write_all(answer.as_bytes()).await.is_err()
                        || stream.write_all(&head).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    address
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test(flavor = "multi_thread")]
async fn the_store_host_reaches_the_gateway_with_the_sandboxes_credential_only() {
    let gateway = echoing_gateway().await;
    let registry = Arc::new(Registry::default());
    let nothing = Policy::parse(&[], &[]).unwrap();
    let token = Arc::new(zeroize::Zeroizing::new(TOKEN.to_owned()));
    registry.add(
        "127.0.0.1".parse().unwrap(),
        "sbx-store",
        nothing.clone(),
        8,
        None,
        Some(token),
    );
    registry.add(
        "127.0.0.2".parse().unwrap(),
        "sbx-none",
        nothing,
        8,
        None,
        None,
    );
    let route = StoreRoute::new(&StoreUpstream {
        url: format!("http://{gateway}"),
        ca_pem: None,
    })
    .unwrap();
    let (flows_tx, mut flows) = mpsc::channel::<Flow>(100);
    let proxy = Proxy::new(
        Arc::clone(&registry),
        Resolver::Fixed(Default::default()),
        ProxyConfig {
            node_addresses: Vec::new(),
            denied_networks: Vec::new(),
            connect_timeout: Duration::from_secs(3),
            head_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(30),
            upstream_tls: sandbase_egress::tls::upstream_config(None).unwrap(),
            max_connections: 64,
            store: Some(Arc::new(route)),
        },
        flows_tx,
    );
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let address: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let serving = tokio::spawn(proxy.serve(listener, sandbase_egress::proxy::Listener::Explicit));

    // Each request gets the credential and loses the sandbox's own (an explicit proxy's
    // connection carries one request).
    for path in ["/openai/v1/chat/completions", "/anthropic/v1/messages"] {
        let mut stream = connect_from("127.0.0.1", address).await;
        let request = format!(
            "POST http://store.sandbase.internal{path} HTTP/1.1\r\nHost: store.sandbase.internal\r\n\
             Authorization: Bearer sk-placeholder\r\nx-api-key: sk-placeholder\r\n\
             X-Sandbase-Sandbox: someone-else\r\nCookie: a=b\r\nContent-Length: 0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = response(&mut stream).await.to_ascii_lowercase();
        assert!(answer.starts_with("http/1.1 200"), "{answer}");
        assert!(
            answer.contains(&format!("post {path} http/1.1")),
            "{answer}"
        );
        assert!(
            answer.contains(&format!("authorization: bearer {TOKEN}")),
            "{answer}"
        );
        assert!(answer.contains(&format!("host: {gateway}")), "{answer}");
        for gone in ["sk-placeholder", "someone-else", "cookie"] {
            assert!(
                !answer.contains(gone),
                "{gone} reached the gateway: {answer}"
            );
        }
    }

    // Only the store's routes, no way around them.
    for path in [
        "/v1/api-keys",
        "/openai/../v1/api-keys",
        "/openai/%2E%2E/v1/x",
    ] {
        let mut stream = connect_from("127.0.0.1", address).await;
        let request = format!(
            "GET http://store.sandbase.internal{path} HTTP/1.1\r\nHost: store.sandbase.internal\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = response(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 404"), "{path}: {answer}");
        assert!(!answer.contains(TOKEN));
    }
    // A sandbox without store access, and TLS to the name, are refused.
    let mut stream = connect_from("127.0.0.2", address).await;
    stream
        .write_all(b"GET http://store.sandbase.internal/openai/v1/models HTTP/1.1\r\nHost: store.sandbase.internal\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("store access"), "{answer}");
    let mut stream = connect_from("127.0.0.1", address).await;
    stream
        .write_all(b"CONNECT store.sandbase.internal:443 HTTP/1.1\r\nHost: store.sandbase.internal:443\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");

    // The flow log: the store connections with the credential named, the refusals.
    let mut seen = Vec::new();
    while let Ok(Some(flow)) = tokio::time::timeout(Duration::from_secs(2), flows.recv()).await {
        seen.push(flow);
    }
    let allowed = seen
        .iter()
        .find(|flow| flow.sandbox == "sbx-store" && flow.decision == Decision::Allowed)
        .expect("the store connection's flow");
    assert_eq!(allowed.host, "store.sandbase.internal");
    assert_eq!(allowed.credentials, vec!["sandbase-store".to_owned()]);
    assert!(allowed.bytes_up > 0 && allowed.bytes_down > 0);
    assert!(seen.iter().any(|flow| flow.sandbox == "sbx-none"
        && matches!(&flow.decision, Decision::Denied(why) if why.contains("store access"))));
    // Store bytes are the store's to bill: not on the sandbox's egress meter.
    let entry = registry.get("127.0.0.1".parse().unwrap()).unwrap();
    assert_eq!(entry.metered.load(std::sync::atomic::Ordering::Relaxed), 0);
    serving.abort();
}
