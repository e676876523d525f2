//! A local stand-in for the model providers, speaking their wire formats: OpenAI chat
//! completions (whole and streamed, with `stream_options.include_usage`), Anthropic messages
//! (whole and streamed, with cumulative `message_delta`s) and token counting. What a request
//! asks for is in its last message: `busy` (429 with `Retry-After`), `broken` (500),
//! `overloaded` (Anthropic's 529 with `Retry-After`), `slow` (a pause between
//! chunks), `no usage` (a stream that never reports usage). It answers only to the
//! operator's credential, and keeps what it was sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

pub const OPENAI_SECRET: &str = "upstream-secret-openai";
pub const ANTHROPIC_SECRET: &str = "upstream-secret-anthropic";
pub const API_SECRET: &str = "upstream-secret-api&=?";
/// The body of the stand-in's 500.
pub const BROKEN: &str = r#"{"error":{"message":"the stand-in broke","type":"server_error"}}"#;

/// What the stand-in received: headers and bodies.
#[derive(Default, Clone)]
pub struct Seen(pub Arc<Mutex<Vec<(HeaderMap, Value)>>>);

impl Seen {
    pub fn last(&self) -> (HeaderMap, Value) {
        self.0.lock().unwrap().last().cloned().unwrap()
    }
}

pub async fn start() -> (String, Seen) {
    let seen = Seen::default();
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/api/{*path}", axum::routing::any(paid_api))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (address, seen)
}

fn asked(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .and_then(|message| message["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn refusal(headers: &HeaderMap, body: &Value, header: &str, secret: &str) -> Option<Response> {
    let credential = headers.get(header).and_then(|value| value.to_str().ok());
    let expected = if header == "authorization" {
        format!("Bearer {secret}")
    } else {
        secret.to_owned()
    };
    if credential != Some(expected.as_str()) {
        return Some((StatusCode::UNAUTHORIZED, "bad key").into_response());
    }
    if asked(body).contains("broken") {
        return Some((StatusCode::INTERNAL_SERVER_ERROR, BROKEN).into_response());
    }
    if asked(body).contains("overloaded") {
        let overloaded = json!({ "type": "error",
            "error": { "type": "overloaded_error", "message": "Overloaded" } });
        let status = StatusCode::from_u16(529).unwrap();
        return Some((status, [("retry-after", "3")], Json(overloaded)).into_response());
    }
    if asked(body).contains("busy") {
        return Some(
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "7")],
                Json(json!({ "error": { "message": "slow down", "type": "rate_limit" } })),
            )
                .into_response(),
        );
    }
    None
}

/// Server-sent events, with a pause between them when asked.
fn events(events: Vec<String>, pause: Duration) -> Response {
    let stream = futures_util::stream::unfold(events.into_iter(), move |mut rest| async move {
        let next = rest.next()?;
        tokio::time::sleep(pause).await;
        Some((Ok::<_, std::io::Error>(next), rest))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

async fn chat(State(seen): State<Seen>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    seen.0.lock().unwrap().push((headers.clone(), body.clone()));
    if let Some(refused) = refusal(&headers, &body, "authorization", OPENAI_SECRET) {
        return refused;
    }
    let usage = json!({
        "prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
        "prompt_tokens_details": { "cached_tokens": 200 }
    });
    let text = "Hello from the stand-in";
    if body["stream"] != true {
        return Json(json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{ "index": 0, "finish_reason": "stop",
                          "message": { "role": "assistant", "content": text } }],
            "usage": usage,
        }))
        .into_response();
    }
    let chunk = |delta: Value, finish: Value| {
        let mut chunk = json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": body["model"],
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        });
        if body["stream_options"]["include_usage"] == true {
            chunk["usage"] = Value::Null;
        }
        format!("data: {chunk}\n\n")
    };
    let mut out = vec![chunk(
        json!({ "role": "assistant", "content": "" }),
        Value::Null,
    )];
    for word in text.split_inclusive(' ') {
        out.push(chunk(json!({ "content": word }), Value::Null));
    }
    out.push(chunk(json!({}), json!("stop")));
    let wants_usage = body["stream_options"]["include_usage"] == true;
    if wants_usage && !asked(&body).contains("no usage") {
        let last = json!({ "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                           "model": body["model"], "choices": [], "usage": usage });
        out.push(format!("data: {last}\n\n"));
    }
    out.push("data: [DONE]\n\n".to_owned());
    let pause = if asked(&body).contains("slow") {
        200
    } else {
        0
    };
    events(out, Duration::from_millis(pause))
}

async fn messages(
    State(seen): State<Seen>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    seen.0.lock().unwrap().push((headers.clone(), body.clone()));
    if let Some(refused) = refusal(&headers, &body, "x-api-key", ANTHROPIC_SECRET) {
        return refused;
    }
    let usage = json!({ "input_tokens": 100, "cache_read_input_tokens": 30,
                        "cache_creation_input_tokens": 20, "output_tokens": 77 });
    let message = |usage: Value| {
        json!({ "id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                "content": [{ "type": "text", "text": "Hello from the stand-in" }],
                "stop_reason": "end_turn", "stop_sequence": null, "usage": usage })
    };
    if body["stream"] != true {
        return Json(message(usage)).into_response();
    }
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut start = message(json!({ "input_tokens": 100, "cache_read_input_tokens": 30,
                                     "cache_creation_input_tokens": 20, "output_tokens": 1 }));
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    let out = vec![
        event(
            "message_start",
            json!({ "type": "message_start", "message": start }),
        ),
        event(
            "content_block_start",
            json!({ "type": "content_block_start", "index": 0,
            "content_block": { "type": "text", "text": "" } }),
        ),
        event(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 0,
            "delta": { "type": "text_delta", "text": "Hello from " } }),
        ),
        // Cumulative: the second delta's count replaces the first's.
        event(
            "message_delta",
            json!({ "type": "message_delta",
            "delta": { "stop_reason": null, "stop_sequence": null }, "usage": { "output_tokens": 40 } }),
        ),
        event(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 0,
            "delta": { "type": "text_delta", "text": "the stand-in" } }),
        ),
        event(
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": 0 }),
        ),
        event(
            "message_delta",
            json!({ "type": "message_delta",
            "delta": { "stop_reason": "end_turn", "stop_sequence": null }, "usage": { "output_tokens": 77 } }),
        ),
        event("message_stop", json!({ "type": "message_stop" })),
    ];
    let pause = if asked(&body).contains("slow") {
        200
    } else {
        0
    };
    events(out, Duration::from_millis(pause))
}

async fn count_tokens(
    State(seen): State<Seen>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    seen.0.lock().unwrap().push((headers.clone(), body.clone()));
    if let Some(refused) = refusal(&headers, &body, "x-api-key", ANTHROPIC_SECRET) {
        return refused;
    }
    Json(json!({ "input_tokens": 42 })).into_response()
}

/// A paid API: `search` echoes its query, `big` answers 2 MiB, `fail` answers 500; only
/// with the operator's credential as `key`.
async fn paid_api(
    State(seen): State<Seen>,
    axum::extract::Path(path): axum::extract::Path<String>,
    Query(query): Query<Vec<(String, String)>>,
    headers: HeaderMap,
) -> Response {
    let keys: Vec<&String> = query
        .iter()
        .filter(|(name, _)| name == "key")
        .map(|(_, value)| value)
        .collect();
    seen.0
        .lock()
        .unwrap()
        .push((headers.clone(), json!({ "path": path, "query": query })));
    if keys != [API_SECRET] {
        return (StatusCode::UNAUTHORIZED, "bad key").into_response();
    }
    match path.as_str() {
        "search" => {
            let q = query
                .iter()
                .find(|(name, _)| name == "q")
                .map(|(_, value)| value.clone());
            Json(json!({ "q": q, "results": ["one", "two"] })).into_response()
        }
        "big" => vec![b'x'; 2 * 1024 * 1024].into_response(),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "broken").into_response(),
    }
}
