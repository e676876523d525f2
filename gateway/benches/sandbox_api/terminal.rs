//! Terminal sessions through the gateway's WebSocket, against the agent's own attachment to
//! the same session (the worker's Unix socket to the sandbox): keystroke echo, output
//! throughput, and re-attaching with 1 MiB to replay.

use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::{Api, Samples};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub struct TerminalSamples {
    echo: Samples,
    echo_direct: Samples,
    /// Through the gateway and from the agent directly: (MB/s delivered, bytes skipped
    /// because the reader fell behind the kept output).
    /// (recorded, from the agent, not recorded).
    throughput: [(f64, u64); 3],
    replay: Samples,
    replay_direct: Samples,
}

/// The program a session runs: raw mode (bytes pass as they are), then `script`.
fn raw(script: &str) -> Value {
    json!({ "cmd": ["sh", "-c", format!("stty raw -echo; {script}")] })
}

async fn open(api: &Api, id: &str, body: Value) -> u32 {
    let (status, opened) = api.post(&format!("/v1/sandboxes/{id}/pty"), body).await;
    assert_eq!(status, 201, "{opened}");
    opened["session_id"].as_u64().expect("session") as u32
}

async fn websocket(api: &Api, id: &str, session: u32, since: u64) -> Socket {
    let url = format!(
        "{}/v1/sandboxes/{id}/pty/{session}/attach?since={since}",
        api.url.replace("http://", "ws://")
    );
    let mut request = url.into_client_request().expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {}", api.token).parse().expect("header"),
    );
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("attach");
    socket
}

/// Bytes of binary messages until `count` arrived (control messages skipped).
async fn receive(socket: &mut Socket, count: usize) {
    let mut got = 0;
    while got < count {
        match socket.next().await {
            Some(Ok(Message::Binary(bytes))) => got += bytes.len(),
            Some(Ok(_)) => {}
            other => panic!("the terminal ended: {other:?}"),
        }
    }
}

/// The agent's own attachment (and the offset its output starts at).
async fn direct_at(agent: &Path, session: u32, since: u64) -> (tokio::net::UnixStream, u64) {
    let mut stream = tokio::net::UnixStream::connect(agent).await.expect("agent");
    let request =
        serde_json::to_vec(&json!({ "op": "pty_attach", "session": session, "since": since }))
            .expect("json");
    write_frame(&mut stream, 1, &request).await;
    let (kind, reply) = read_frame(&mut stream).await;
    assert_eq!(kind, 1);
    let reply: Value = serde_json::from_slice(&reply).expect("reply");
    let offset = reply
        .pointer("/pty_attached/offset")
        .and_then(Value::as_u64);
    (stream, offset.expect("attached"))
}

async fn direct(agent: &Path, session: u32, since: u64) -> tokio::net::UnixStream {
    direct_at(agent, session, since).await.0
}

async fn write_frame(stream: &mut tokio::net::UnixStream, kind: u8, payload: &[u8]) {
    let mut frame = vec![kind];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    stream.write_all(&frame).await.expect("write");
}

async fn read_frame(stream: &mut tokio::net::UnixStream) -> (u8, Vec<u8>) {
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).await.expect("frame");
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    let mut payload = vec![0; length];
    stream.read_exact(&mut payload).await.expect("payload");
    (header[0], payload)
}

/// The end of a throughput run in the output.
const MARK: &[u8] = b"END-OF-RUN";

fn ends_run(tail: &mut Vec<u8>, bytes: &[u8]) -> bool {
    tail.extend_from_slice(bytes);
    let found = tail.windows(MARK.len()).any(|window| window == MARK);
    let keep = tail.len().saturating_sub(MARK.len());
    tail.drain(..keep);
    found
}

/// Output until the run's mark: (bytes delivered, bytes skipped by lags).
async fn run_through_socket(socket: &mut Socket, mut offset: u64) -> (u64, u64) {
    let (mut delivered, mut skipped, mut tail) = (0, 0, Vec::new());
    loop {
        match socket.next().await {
            Some(Ok(Message::Binary(bytes))) => {
                delivered += bytes.len() as u64;
                offset += bytes.len() as u64;
                if ends_run(&mut tail, &bytes) {
                    return (delivered, skipped);
                }
            }
            Some(Ok(Message::Text(text))) => {
                let control: Value = serde_json::from_str(&text).expect("control");
                if let Some(to) = control["offset"]
                    .as_u64()
                    .filter(|_| control["type"] == "lag")
                {
                    skipped += to.saturating_sub(offset);
                    offset = to;
                }
            }
            Some(Ok(_)) => {}
            other => panic!("the terminal ended: {other:?}"),
        }
    }
}

async fn run_through_agent(stream: &mut tokio::net::UnixStream, mut offset: u64) -> (u64, u64) {
    let (mut delivered, mut skipped, mut tail) = (0, 0, Vec::new());
    loop {
        let (kind, payload) = read_frame(stream).await;
        match kind {
            4 => {
                delivered += payload.len() as u64;
                offset += payload.len() as u64;
                if ends_run(&mut tail, &payload) {
                    return (delivered, skipped);
                }
            }
            1 => {
                let reply: Value = serde_json::from_slice(&payload).expect("reply");
                if let Some(to) = reply.pointer("/pty_lag/offset").and_then(Value::as_u64) {
                    skipped += to.saturating_sub(offset);
                    offset = to;
                }
            }
            _ => panic!("the terminal ended"),
        }
    }
}

async fn receive_direct(stream: &mut tokio::net::UnixStream, count: usize) {
    let mut got = 0;
    while got < count {
        let (kind, payload) = read_frame(stream).await;
        assert!(kind == 4 || kind == 1, "the terminal ended");
        if kind == 4 {
            got += payload.len();
        }
    }
}

/// 64 MiB of output over the WebSocket of a new session: (MB/s, bytes skipped, session).
async fn websocket_throughput(api: &Api, id: &str, record: bool) -> (f64, u64, u32) {
    let size = 64 * 1024 * 1024;
    let script = format!(
        "while :; do head -c 1 >/dev/null; head -c {size} /dev/zero | tr '\\0' x; printf END-OF-RUN; done"
    );
    let mut body = raw(&script);
    body["record"] = json!(record);
    let session = open(api, id, body).await;
    let mut socket = websocket(api, id, session, u64::MAX).await;
    let attached = socket.next().await.expect("attached").expect("attached");
    let attached: Value = serde_json::from_str(attached.to_text().expect("text")).expect("json");
    let started = Instant::now();
    socket
        .send(Message::Binary(b"k".to_vec().into()))
        .await
        .expect("send");
    let (delivered, skipped) =
        run_through_socket(&mut socket, attached["offset"].as_u64().unwrap_or(0)).await;
    let rate = delivered as f64 / 1e6 / started.elapsed().as_secs_f64();
    (rate, skipped, session)
}

/// The run of median rate.
fn median(mut runs: Vec<(f64, u64)>) -> (f64, u64) {
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs[runs.len() / 2]
}

pub async fn terminal_samples(api: &Api, id: &str, agent: &Path, keys: usize) -> TerminalSamples {
    // Keystroke echo: `cat` in raw mode sends each byte back.
    let session = open(api, id, raw("exec cat")).await;
    let mut socket = websocket(api, id, session, u64::MAX).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut echo = Samples(Vec::new());
    for _ in 0..keys {
        let started = Instant::now();
        socket
            .send(Message::Binary(b"x".to_vec().into()))
            .await
            .expect("send");
        receive(&mut socket, 1).await;
        echo.0.push(started.elapsed());
    }
    let mut stream = direct(agent, session, u64::MAX).await;
    let mut echo_direct = Samples(Vec::new());
    for _ in 0..keys {
        let started = Instant::now();
        write_frame(&mut stream, 4, b"x").await;
        // Both attachments see the echo; read this one's.
        receive_direct(&mut stream, 1).await;
        echo_direct.0.push(started.elapsed());
        receive(&mut socket, 1).await;
    }
    drop((socket, stream));

    // Throughput: 64 MiB once a key is pressed, then a mark; recorded and not, alternately.
    let (mut recorded, mut unrecorded) = (Vec::new(), Vec::new());
    let mut session = 0;
    for _ in 0..3 {
        let (rate, skipped, number) = websocket_throughput(api, id, false).await;
        unrecorded.push((rate, skipped));
        let (rate, skipped, number_recorded) = websocket_throughput(api, id, true).await;
        recorded.push((rate, skipped));
        for closed in [number, session].into_iter().filter(|&n| n != 0) {
            api.delete(&format!("/v1/sandboxes/{id}/pty/{closed}"))
                .await;
        }
        session = number_recorded;
    }
    let through_gateway = median(recorded);
    let unrecorded = median(unrecorded);
    let (mut stream, offset) = direct_at(agent, session, u64::MAX).await;
    let started = Instant::now();
    write_frame(&mut stream, 4, b"k").await;
    let (delivered, skipped) = run_through_agent(&mut stream, offset).await;
    let from_agent = (
        delivered as f64 / 1e6 / started.elapsed().as_secs_f64(),
        skipped,
    );
    drop(stream);

    // Re-attach with 1 MiB kept: all of it replayed.
    let mib = 1024 * 1024;
    let (mut replay, mut replay_direct) = (Samples(Vec::new()), Samples(Vec::new()));
    for _ in 0..10 {
        let started = Instant::now();
        let mut socket = websocket(api, id, session, 0).await;
        receive(&mut socket, mib).await;
        replay.0.push(started.elapsed());
        let started = Instant::now();
        let mut stream = direct(agent, session, 0).await;
        receive_direct(&mut stream, mib).await;
        replay_direct.0.push(started.elapsed());
    }
    TerminalSamples {
        echo,
        echo_direct,
        throughput: [through_gateway, from_agent, unrecorded],
        replay,
        replay_direct,
    }
}

impl TerminalSamples {
    pub fn print(mut self) {
        println!(
            "| keystroke echo over the WebSocket | {:.2} | {:.2} | the agent's own attachment | {:.2} | {:.2} | {:.1} |",
            self.echo.ms(0.5),
            self.echo.ms(0.99),
            self.echo_direct.ms(0.5),
            self.echo_direct.ms(0.99),
            self.echo.ms(0.5) / self.echo_direct.ms(0.5)
        );
        println!(
            "| re-attach, 1 MiB replayed | {:.1} | {:.1} | the agent's own attachment | {:.1} | {:.1} | {:.1} |",
            self.replay.ms(0.5),
            self.replay.ms(0.99),
            self.replay_direct.ms(0.5),
            self.replay_direct.ms(0.99),
            self.replay.ms(0.5) / self.replay_direct.ms(0.5)
        );
        let [gateway, agent, unrecorded] = self.throughput;
        println!(
            "\nterminal output (64 MiB, median of 3): {:.0} MB/s over the WebSocket recorded ({} bytes skipped), \
             {:.0} MB/s not recorded ({} bytes skipped): recording costs {:.1} %; \
             {:.0} MB/s from the agent directly ({} bytes skipped); recorded/direct {:.2}",
            gateway.0,
            gateway.1,
            unrecorded.0,
            unrecorded.1,
            (1.0 - gateway.0 / unrecorded.0) * 100.0,
            agent.0,
            agent.1,
            gateway.0 / agent.0
        );
    }
}
