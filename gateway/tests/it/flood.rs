//! An anonymous flood against the listener and the authentication path: headers trickled
//! byte by byte, one address holding every connection, one address asking too fast, a stream
//! of made-up keys, a crowd of password guesses. Each attack fails and the gateway keeps
//! serving everybody else.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::helpers::{TestApp, email, spawn_app_with};

fn socket_address(app: &TestApp) -> std::net::SocketAddr {
    app.address.trim_start_matches("http://").parse().unwrap()
}

/// A whole `GET /healthz` from `source` (an address of the loopback network): the status line.
async fn healthz_from(app: &TestApp, source: &str) -> String {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(socket_address(app)).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Whether the server closed `stream` within `within` (read end, reset, or an error answer).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 256];
    matches!(
        tokio::time::timeout(within, stream.read(&mut buffer)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn a_client_trickling_its_headers_is_cut_off() {
    let app = spawn_app_with(|settings| settings.server.header_read_timeout_secs = 1).await;
    let mut stream = TcpStream::connect(socket_address(&app)).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    // One header byte every 200 ms, never finishing the headers.
    let mut cut_off = false;
    while started.elapsed() < Duration::from_secs(8) {
        if stream.write_all(b"X").await.is_err() {
            cut_off = true;
            break;
        }
        let mut buffer = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buffer)).await {
            Err(_) => {}
            Ok(Ok(read)) => {
                let answer = String::from_utf8_lossy(&buffer[..read]).into_owned();
                assert!(!answer.contains(" 200 "), "{answer}");
                cut_off = true;
                break;
            }
            Ok(Err(_)) => {
                cut_off = true;
                break;
            }
        }
    }
    let waited = started.elapsed();
    assert!(
        cut_off,
        "the slow client was still connected after {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "cut off only after {waited:?}"
    );
    assert!(healthz_from(&app, "127.0.0.1").await.contains(" 200 "));
}

#[tokio::test]
async fn one_address_cannot_hold_every_connection() {
    let app = spawn_app_with(|settings| settings.server.max_connections_per_ip = 4).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(socket_address(&app)).await.unwrap());
    }
    // The fifth from the same address is closed at once…
    let mut fifth = TcpStream::connect(socket_address(&app)).await.unwrap();
    assert!(closed_within(&mut fifth, Duration::from_secs(3)).await);
    // …while another address is served…
    assert!(healthz_from(&app, "127.0.0.2").await.contains(" 200 "));
    // …and the address itself once it lets go.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !healthz_from(&app, "127.0.0.1").await.contains(" 200 ") {
        assert!(
            Instant::now() < deadline,
            "the address was never served again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A gateway that believes `X-Forwarded-For` from the test (127.0.0.1).
async fn forwarded_app(configure: impl FnOnce(&mut sandbase_gateway::Settings)) -> TestApp {
    spawn_app_with(|settings| {
        settings.server.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
        configure(settings);
    })
    .await
}

async fn get_from(app: &TestApp, address: &str, path: &str, token: &str) -> reqwest::Response {
    app.http
        .get(format!("{}{path}", app.address))
        .header("x-forwarded-for", address)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn one_address_asking_too_fast_is_turned_away_before_anything_else() {
    let app = forwarded_app(|settings| {
        settings.server.requests_per_ip_per_second = 5;
        settings.server.requests_per_ip_burst = 10;
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..30 {
        statuses.push(
            get_from(&app, "198.51.100.1", "/healthz", "")
                .await
                .status(),
        );
    }
    let refused = statuses
        .iter()
        .filter(|status| **status == StatusCode::TOO_MANY_REQUESTS)
        .count();
    // A burst of 10, then 5 a second: about 20 of 30 refused when the requests come fast,
    // a few fewer on a loaded machine (none at all without the limit).
    assert!(
        (10..=20).contains(&refused),
        "{refused} of 30 refused: {statuses:?}"
    );
    let refusal = get_from(&app, "198.51.100.1", "/healthz", "").await;
    assert_eq!(refusal.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refusal.headers().contains_key("retry-after"));
    let body: serde_json::Value = refusal.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    // Another address is untouched.
    let other = get_from(&app, "198.51.100.2", "/healthz", "").await;
    assert_eq!(other.status(), StatusCode::OK);
}

#[tokio::test]
async fn made_up_keys_cost_one_lookup_then_the_address_is_shut_out() {
    let app = forwarded_app(|settings| {
        settings.auth.failed_auth_per_minute = 20;
        // Only the failures' limit is under test here.
        settings.server.requests_per_ip_per_second = 0;
    })
    .await;
    let owner = app.signup(&email("shutout"), "Shutout").await;
    let made_up = format!("sb_{}_{}", "a".repeat(16), "b".repeat(40));
    let lookups = app.state.key_lookups();
    let audit_rows = app.count("SELECT count(*) FROM audit_events").await;
    let (mut unauthorized, mut refused) = (0, 0);
    for _ in 0..300 {
        match get_from(&app, "203.0.113.66", "/v1/me", &made_up)
            .await
            .status()
        {
            StatusCode::UNAUTHORIZED => unauthorized += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((unauthorized, refused), (20, 280));
    // One made-up key is read from Postgres once, however often it is presented.
    assert_eq!(app.state.key_lookups() - lookups, 1);
    // The attempts leave a handful of audit rows, not 300.
    let added = app.count("SELECT count(*) FROM audit_events").await - audit_rows;
    assert!(added <= 3, "{added} audit rows");
    // Behind a shared proxy everyone has the attacker's address: a valid key from it is still
    // served (the credential is checked first; only failures are refused), and so is a
    // neighbour's.
    let real = owner.api_key.token.as_str();
    for address in ["203.0.113.66", "203.0.113.67"] {
        assert_eq!(
            get_from(&app, address, "/v1/me", real).await.status(),
            StatusCode::OK
        );
    }
    // Made-up keys of fresh ids from the shut-out address are refused, and their Postgres
    // reads held to a small gateway-wide budget, however many come.
    let lookups = app.state.key_lookups();
    for index in 0..200 {
        let fresh = format!("sb_{:016}_{}", index, "c".repeat(40));
        let status = get_from(&app, "203.0.113.66", "/v1/me", &fresh)
            .await
            .status();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    }
    let read = app.state.key_lookups() - lookups;
    assert!(
        read <= 30,
        "{read} lookups for 200 made-up keys from a shut-out address"
    );
}

#[tokio::test]
async fn a_crowd_of_password_guesses_waits_for_few_hashing_slots() {
    let app = spawn_app_with(|settings| settings.auth.password_slots = 1).await;
    let address = email("crowd");
    let owner = app.signup(&address, "Crowd").await;
    let guesses = (0..24).map(|index| {
        let app = &app;
        let address = address.clone();
        async move {
            app.post(
                "/v1/auth/login",
                "",
                json!({ "email": address, "password": format!("wrong guess {index:04}") }),
            )
            .await
        }
    });
    let answers = futures_util::future::join_all(guesses).await;
    let busy = answers
        .iter()
        .filter(|answer| answer.status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    for answer in &answers {
        match answer.status.as_u16() {
            401 => {}
            503 => {
                assert_eq!(answer.code(), "busy");
                assert_eq!(answer.headers["retry-after"], "1");
            }
            other => panic!("unexpected {other}: {}", answer.body),
        }
    }
    assert!(busy > 0, "24 guesses at once all got a hashing slot");
    // Once the crowd is gone, the owner logs in.
    let session = app.login(&address, Some(owner.team.id)).await;
    assert_eq!(app.get("/v1/me", &session).await.status, StatusCode::OK);
}

/// Sends a request head announcing `length` bytes of body, sends none, and returns the status
/// line the server answers with (within 3 s), if any.
async fn head_only<S>(mut stream: S, head: String) -> Option<String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream.write_all(head.as_bytes()).await.ok()?;
    let mut answer = vec![0u8; 512];
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut answer))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&answer[..read])
        .lines()
        .next()
        .map(str::to_owned)
}

#[tokio::test]
async fn credentials_are_checked_before_any_body_is_read() {
    let app = crate::helpers::spawn_app().await;
    // The public API: a made-up key, a megabyte announced and never sent.
    let made_up = format!("sb_{}_{}", "a".repeat(16), "b".repeat(40));
    let stream = TcpStream::connect(socket_address(&app)).await.unwrap();
    let head = format!(
        "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {made_up}\r\n\
         Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"
    );
    let status = head_only(stream, head).await;
    assert!(
        status.as_deref().is_some_and(|line| line.contains(" 401 ")),
        "{status:?}"
    );
    // The internal plane: a usage report of 16 MB announced with a wrong credential.
    let internal: std::net::SocketAddr =
        app.internal.trim_start_matches("https://").parse().unwrap();
    let tcp = TcpStream::connect(internal).await.unwrap();
    let connector =
        tokio_rustls::TlsConnector::from(sandbase_gateway::testing::channel().client.clone());
    let server_name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector.connect(server_name, tcp).await.unwrap();
    let head =
        "POST /internal/v1/usage HTTP/1.1\r\nHost: x\r\nx-sandbase-node-token: swc_w.bogus\r\n\
                Content-Type: application/json\r\nContent-Length: 16000000\r\n\r\n"
            .to_owned();
    let status = head_only(tls, head).await;
    assert!(
        status.as_deref().is_some_and(|line| line.contains(" 401 ")),
        "{status:?}"
    );
}
