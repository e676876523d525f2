use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{BINARY, Server, stderr};

#[test]
fn the_server_refuses_to_start_with_a_missing_or_bad_setting_and_names_it() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "database.url"),
        (&[("DATABASE_URL", "postgres://127.0.0.1/x")], "redis.url"),
        (
            &[
                ("DATABASE_URL", "mysql://nope"),
                ("REDIS_URL", "redis://127.0.0.1"),
            ],
            "database.url",
        ),
        (
            &[
                ("DATABASE_URL", "postgres://127.0.0.1/x"),
                ("REDIS_URL", "redis://127.0.0.1"),
            ],
            "auth.jwt_secret",
        ),
        (
            &[
                ("DATABASE_URL", "postgres://127.0.0.1/x"),
                ("REDIS_URL", "redis://127.0.0.1"),
                (
                    "SANDBASE_AUTH__JWT_SECRET",
                    "0123456789abcdef0123456789abcdef",
                ),
                ("SANDBASE_RATE_LIMIT__PER_SECOND", "lots"),
            ],
            "rate_limit.per_second",
        ),
    ];
    for (env, key) in cases {
        let output = Command::new(BINARY)
            .arg("server")
            .env_clear()
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("run sandbase server");
        assert!(!output.status.success(), "started with {env:?}");
        assert!(
            stderr(&output).contains(key),
            "for {env:?} expected {key} in: {}",
            stderr(&output)
        );
    }
}

#[test]
fn a_worker_refuses_a_bad_pinned_name_and_says_why() {
    for (value, expected) in [
        ("api.example.com", "is not NAME=IP"),
        ("bad_name=203.0.113.7", "`bad_name` is not a host name"),
        (
            "api.example.com=203.0.113.999",
            "`203.0.113.999` is not an IP address",
        ),
        ("-x.example.com=203.0.113.7", "is not a host name"),
    ] {
        let output = Command::new(BINARY)
            .args(["worker", &format!("--egress-resolve={value}")])
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .expect("run sandbase worker");
        assert!(!output.status.success(), "started with {value}");
        assert!(
            stderr(&output).contains("--egress-resolve") && stderr(&output).contains(expected),
            "for {value} expected {expected} in: {}",
            stderr(&output)
        );
    }
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_then_exits_cleanly() {
    let mut server = Server::start(&[]).await;
    let address = server.url.trim_start_matches("http://").to_owned();
    let body = serde_json::json!({
        "email": format!("drain-{}@example.com", uuid::Uuid::new_v4().simple()),
        "password": "a long enough password",
        "team_name": "Drain",
    })
    .to_string();
    // The request is in flight once the server asks for its body (`100 Continue`):
    // the signal arrives then, and the body only after it.
    let mut stream = std::net::TcpStream::connect(&address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "POST /v1/auth/signup HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    )
    .expect("send headers");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("read 100 Continue");
    assert!(
        line.starts_with("HTTP/1.1 100"),
        "expected 100 Continue, got {line:?}"
    );
    reader.read_line(&mut line).expect("blank line");
    server.signal_terminate();
    std::thread::sleep(Duration::from_millis(200));
    stream.write_all(body.as_bytes()).expect("send body");
    let mut answer = String::new();
    reader.read_line(&mut answer).expect("read the answer");
    assert!(
        answer.starts_with("HTTP/1.1 201"),
        "the in-flight request was answered with {answer:?}"
    );
    drop(reader);
    drop(stream);
    let status = tokio::task::spawn_blocking(move || {
        let status = server.wait_exit(Duration::from_secs(15));
        drop(server);
        status
    })
    .await
    .expect("join");
    assert!(status.success(), "exit status {status:?}");
}

#[tokio::test]
async fn traces_are_exported_over_otlp_when_an_endpoint_is_configured() {
    let collector = Collector::start();
    let mut server = Server::start(&[(
        "SANDBASE_TELEMETRY__OTLP_ENDPOINT",
        format!("http://{}", collector.address),
    )])
    .await;
    let client = reqwest::Client::new();
    for _ in 0..3 {
        client
            .get(format!("{}/healthz", server.url))
            .send()
            .await
            .expect("request");
    }
    // Shutdown flushes the batch exporter.
    let status = tokio::task::spawn_blocking(move || server.terminate(Duration::from_secs(15)))
        .await
        .expect("join");
    assert!(status.success());
    let received = collector.received.lock().expect("lock").clone();
    assert!(
        received
            .iter()
            .any(|(path, content_type, length)| path == "/v1/traces"
                && content_type == "application/x-protobuf"
                && *length > 0),
        "no OTLP trace export arrived: {received:?}"
    );
}

/// A minimal OTLP/HTTP collector: records path, content type and body size of each POST.
struct Collector {
    address: String,
    received: Arc<Mutex<Vec<(String, String, usize)>>>,
}

impl Collector {
    fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    let mut writer = stream.try_clone().expect("clone");
                    let mut reader = BufReader::new(stream);
                    loop {
                        let mut request_line = String::new();
                        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                            return;
                        }
                        let path = request_line
                            .split_whitespace()
                            .nth(1)
                            .unwrap_or("")
                            .to_owned();
                        let (mut length, mut content_type) = (0usize, String::new());
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            let line = line.trim_end();
                            if line.is_empty() {
                                break;
                            }
                            if let Some((name, value)) = line.split_once(':') {
                                match name.to_ascii_lowercase().as_str() {
                                    "content-length" => length = value.trim().parse().unwrap_or(0),
                                    "content-type" => content_type = value.trim().to_owned(),
                                    _ => {}
                                }
                            }
                        }
                        let mut body = vec![0; length];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        sink.lock()
                            .expect("lock")
                            .push((path, content_type, length));
                        if writer
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                            .is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        Collector { address, received }
    }
}
