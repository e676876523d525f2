//! The store's forwarding, against the same stand-in provider called directly in the same
//! run (a local axum server speaking OpenAI's chat format):
//!
//! - whole answers: chat completions with a 4 KB and a 200 KB request, BENCH_STORE_CALLS
//!   (1000) each, through the gateway (authentication, admission in Redis, forwarding,
//!   settlement in PostgreSQL before the answer) and directly, alternately;
//! - streams: the time to the first chunk through the gateway and directly, and the gaps
//!   between chunks the stand-in sends 50 ms apart (a batched chunk would show as a gap
//!   near zero), BENCH_STORE_STREAMS (50) streams of 10 chunks;
//! - BENCH_STORE_OPEN (1000) streams open at once through the gateway (5 chunks 1 s apart),
//!   counting the ones that did not arrive whole;
//! - translation: chat completions (4 KB) answered by an Anthropic model through the gateway,
//!   against the stand-in's Messages route called directly with the Messages request, and
//!   messages answered by an OpenAI model against the chat request they become.
//!
//! Needs PostgreSQL and Redis (scripts/setup): `cargo bench -p sandbase-gateway --bench store`.

use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandbase_gateway::config::{ModelSettings, ProviderKind, ProviderSettings};
use sandbase_gateway::{Application, testing};
use serde_json::{Value, json};

const SECRET: &str = "bench-upstream-secret";

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn percentile_ms(samples: &mut [Duration], fraction: f64) -> f64 {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * fraction).round() as usize;
    samples[index].as_secs_f64() * 1000.0
}

/// The stand-in: a whole answer, or `chunks` chunks `gap_ms` apart when streaming.
async fn chat(Json(body): Json<Value>) -> Response {
    let usage = json!({ "prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020 });
    if body["stream"] != true {
        return Json(json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{ "index": 0, "finish_reason": "stop",
                          "message": { "role": "assistant", "content": "fine" } }],
            "usage": usage,
        }))
        .into_response();
    }
    // The stream's shape rides in `metadata` (string values, as OpenAI's are): the store
    // passes on only the fields chat completions know.
    let number = |name: &str, default: u64| {
        body.pointer(&format!("/metadata/{name}"))
            .and_then(Value::as_str)
            .and_then(|text| text.parse().ok())
            .unwrap_or(default)
    };
    let chunks = number("chunks", 10);
    let gap = Duration::from_millis(number("gap_ms", 0));
    let with_usage = body["stream_options"]["include_usage"] == true;
    let stream = futures_util::stream::unfold(0u64, move |sent| async move {
        if sent > chunks {
            return None;
        }
        if sent > 0 {
            tokio::time::sleep(gap).await;
        }
        let event = if sent < chunks {
            let chunk = json!({ "object": "chat.completion.chunk", "usage": null,
                "choices": [{ "index": 0, "delta": { "content": "word " }, "finish_reason": null }] });
            format!("data: {chunk}\n\n")
        } else if with_usage {
            let last = json!({ "object": "chat.completion.chunk", "choices": [], "usage": {
                "prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020 } });
            format!("data: {last}\n\ndata: [DONE]\n\n")
        } else {
            "data: [DONE]\n\n".to_owned()
        };
        Some((Ok::<_, std::io::Error>(event), sent + 1))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .expect("a response")
}

/// The stand-in's Messages route: a whole answer.
async fn messages(Json(body): Json<Value>) -> Response {
    Json(json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
        "content": [{ "type": "text", "text": "fine" }], "stop_reason": "end_turn",
        "stop_sequence": null, "usage": { "input_tokens": 1000, "output_tokens": 20 },
    }))
    .into_response()
}

struct Bench {
    http: reqwest::Client,
    gateway: String,
    direct: String,
    key: String,
}

impl Bench {
    async fn post(&self, through_gateway: bool, body: &Value) -> reqwest::Response {
        let (url, token) = if through_gateway {
            (
                format!("{}/openai/v1/chat/completions", self.gateway),
                self.key.as_str(),
            )
        } else {
            (format!("{}/v1/chat/completions", self.direct), SECRET)
        };
        self.http
            .post(url)
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .expect("an answer")
    }

    /// Whole answers of a request of `size` bytes: (through the gateway, directly).
    async fn whole(&self, size: usize, calls: usize) -> (Vec<Duration>, Vec<Duration>) {
        let body = json!({ "model": "openai/bench", "max_tokens": 100,
            "messages": [{ "role": "user", "content": "x".repeat(size) }] });
        let (mut gateway, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..calls {
            for (through, samples) in [(true, &mut gateway), (false, &mut direct)] {
                let started = Instant::now();
                let answer = self.post(through, &body).await;
                assert_eq!(answer.status(), 200);
                answer.bytes().await.expect("a body");
                samples.push(started.elapsed());
            }
        }
        (gateway, direct)
    }

    /// Chat completions of 4 KB to an Anthropic model through the gateway, and the Messages
    /// request they become sent to the stand-in directly: (through the gateway, directly).
    async fn translated(&self, calls: usize) -> (Vec<Duration>, Vec<Duration>) {
        let text = "x".repeat(4 * 1024);
        let chat = json!({ "model": "anthropic/bench", "max_tokens": 100,
            "messages": [{ "role": "user", "content": text }] });
        let messages = json!({ "model": "bench", "max_tokens": 100,
            "messages": [{ "role": "user", "content": [{ "type": "text", "text": text }] }] });
        let (mut gateway, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..calls {
            let started = Instant::now();
            let answer = self
                .http
                .post(format!("{}/openai/v1/chat/completions", self.gateway))
                .bearer_auth(&self.key)
                .json(&chat)
                .send()
                .await
                .expect("an answer");
            assert_eq!(answer.status(), 200);
            let body: Value = answer.json().await.expect("a chat completion");
            assert_eq!(body["choices"][0]["message"]["content"], "fine");
            gateway.push(started.elapsed());
            let started = Instant::now();
            let answer = self
                .http
                .post(format!("{}/v1/messages", self.direct))
                .header("x-api-key", SECRET)
                .json(&messages)
                .send()
                .await
                .expect("an answer");
            answer.bytes().await.expect("a body");
            direct.push(started.elapsed());
        }
        (gateway, direct)
    }

    /// Messages of 4 KB to an OpenAI model through the gateway, and the chat request they
    /// become sent to the stand-in directly: (through the gateway, directly).
    async fn translated_back(&self, calls: usize) -> (Vec<Duration>, Vec<Duration>) {
        let text = "x".repeat(4 * 1024);
        let messages = json!({ "model": "openai/bench", "max_tokens": 100,
            "messages": [{ "role": "user", "content": text }] });
        let chat = json!({ "model": "bench", "max_completion_tokens": 100,
            "messages": [{ "role": "user", "content": text }] });
        let (mut gateway, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..calls {
            let started = Instant::now();
            let answer = self
                .http
                .post(format!("{}/anthropic/v1/messages", self.gateway))
                .header("x-api-key", &self.key)
                .json(&messages)
                .send()
                .await
                .expect("an answer");
            assert_eq!(answer.status(), 200);
            let body: Value = answer.json().await.expect("a message");
            assert_eq!(body["content"][0]["text"], "fine");
            gateway.push(started.elapsed());
            let started = Instant::now();
            let answer = self.post(false, &chat).await;
            answer.bytes().await.expect("a body");
            direct.push(started.elapsed());
        }
        (gateway, direct)
    }

    /// One stream: (time to the first chunk, gaps between chunks, whole).
    async fn stream(
        &self,
        through: bool,
        chunks: u64,
        gap_ms: u64,
    ) -> (Duration, Vec<Duration>, bool) {
        let body = json!({ "model": "openai/bench", "stream": true,
            "metadata": { "chunks": chunks.to_string(), "gap_ms": gap_ms.to_string() },
            "messages": [{ "role": "user", "content": "hi" }] });
        let started = Instant::now();
        let answer = self.post(through, &body).await;
        if answer.status() != 200 {
            return (started.elapsed(), Vec::new(), false);
        }
        let mut stream = answer.bytes_stream();
        let (mut first, mut last, mut gaps, mut text) = (None, None, Vec::new(), Vec::new());
        while let Some(Ok(chunk)) = stream.next().await {
            let now = Instant::now();
            first.get_or_insert(now - started);
            if let Some(previous) = last {
                gaps.push(now - previous);
            }
            last = Some(now);
            text.extend_from_slice(&chunk);
        }
        let whole = text.ends_with(b"data: [DONE]\n\n");
        (first.unwrap_or_default(), gaps, whole)
    }
}

fn row(name: &str, gateway: &mut [Duration], baseline: &str, direct: &mut [Duration]) {
    let (g50, g99) = (percentile_ms(gateway, 0.5), percentile_ms(gateway, 0.99));
    let (d50, d99) = (percentile_ms(direct, 0.5), percentile_ms(direct, 0.99));
    println!(
        "| {name} | {g50:.2} | {g99:.2} | {baseline} | {d50:.2} | {d99:.2} | +{:.2} ms p50, +{:.2} ms p99 |",
        g50 - d50,
        g99 - d99
    );
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let calls = env_number("BENCH_STORE_CALLS", 1000);
    let streams = env_number("BENCH_STORE_STREAMS", 50);
    let open = env_number("BENCH_STORE_OPEN", 1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let direct = format!("http://{}", listener.local_addr()?);
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(chat))
            .route("/v1/messages", axum::routing::post(messages));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let secret_file = std::env::temp_dir().join(format!("sandbase-bench-store-{}", uuid::Uuid::new_v4()));
        std::fs::write(&secret_file, SECRET)?;
        let mut settings = testing::settings().await;
        settings.database.max_connections = 20;
        let provider = |name: &str, kind, base_url: String| ProviderSettings {
            name: name.to_owned(),
            kind,
            base_url,
            credential_env: None,
            credential_file: Some(secret_file.clone()),
            credential_secret: None,
            timeout_secs: 120,
            connect_timeout_secs: 10,
        };
        settings.store.providers = vec![
            provider("standin", ProviderKind::Openai, format!("{direct}/v1")),
            provider("standin-anthropic", ProviderKind::Anthropic, direct.clone()),
        ];
        let model = |id: &str, provider: &str| ModelSettings {
            id: id.to_owned(),
            provider: provider.to_owned(),
            upstream: "bench".to_owned(),
            context_window: 1_000_000,
            max_output: 1000,
            input: "0.001".to_owned(),
            cached_input: "0".to_owned(),
            cache_write: "0".to_owned(),
            output: "0.001".to_owned(),
        };
        settings.store.models = vec![
            model("openai/bench", "standin"),
            model("anthropic/bench", "standin-anthropic"),
        ];
        let application = Application::build(settings).await?;
        let gateway = format!("http://{}", application.local_addr());
        tokio::spawn(application.run_until_stopped(std::future::pending()));
        let http = reqwest::Client::builder().pool_max_idle_per_host(2000).build()?;
        let signup: Value = http
            .post(format!("{gateway}/v1/auth/signup"))
            .json(&json!({ "email": "bench@example.com", "password": "benchmark password", "team_name": "Bench" }))
            .send()
            .await?
            .json()
            .await?;
        let key = signup["api_key"]["token"].as_str().expect("a key").to_owned();
        let bench = Bench { http, gateway, direct, key };

        println!("| measurement | SandBase p50 ms | p99 ms | baseline | p50 ms | p99 ms | added |");
        println!("|---|---|---|---|---|---|---|");
        let (mut gateway, mut direct) = bench.whole(4 * 1024, calls).await;
        row(&format!("chat, 4 KB request, whole answer ({calls})"), &mut gateway, "the stand-in directly", &mut direct);
        let (mut gateway, mut direct) = bench.whole(200 * 1024, calls / 4).await;
        row(&format!("chat, 200 KB request ({})", calls / 4), &mut gateway, "the stand-in directly", &mut direct);
        let (mut gateway, mut direct) = bench.translated(calls).await;
        row(&format!("chat to an Anthropic model, 4 KB, translated ({calls})"), &mut gateway, "its Messages request directly", &mut direct);
        let (mut gateway, mut direct) = bench.translated_back(calls).await;
        row(&format!("messages to an OpenAI model, 4 KB, translated ({calls})"), &mut gateway, "its chat request directly", &mut direct);

        let (mut first_gateway, mut first_direct, mut gaps) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..streams {
            let (first, stream_gaps, whole) = bench.stream(true, 10, 50).await;
            assert!(whole, "a stream through the gateway broke off");
            first_gateway.push(first);
            gaps.extend(stream_gaps);
            let (first, _, _) = bench.stream(false, 10, 50).await;
            first_direct.push(first);
        }
        row(&format!("stream, first chunk ({streams})"), &mut first_gateway, "the stand-in directly", &mut first_direct);
        let batched = gaps.iter().filter(|gap| **gap < Duration::from_millis(25)).count();
        println!(
            "\nchunks sent 50 ms apart arrived {:.1} ms apart at p50 (min {:.1} ms); {batched} of {} gaps under 25 ms (batched)",
            percentile_ms(&mut gaps, 0.5),
            percentile_ms(&mut gaps, 0.0),
            gaps.len()
        );

        let started = Instant::now();
        let all = futures_util::future::join_all((0..open).map(|_| bench.stream(true, 5, 1000))).await;
        let broken = all.iter().filter(|(_, _, whole)| !whole).count();
        println!(
            "{open} streams open at once through the gateway (5 chunks 1 s apart): {} whole, {broken} not, in {:.1} s",
            open - broken,
            started.elapsed().as_secs_f64()
        );
        let _ = std::fs::remove_file(secret_file);
        anyhow::Ok(())
    })
}
