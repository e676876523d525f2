//! The store's model routes against a local stand-in provider: the operator's credential
//! injected (never the caller's key), usage metered to the micro-credit in every mode (whole,
//! streamed with and without the client asking for usage, Anthropic's cumulative deltas), the
//! gateway's own usage request hidden from the client, errors in each family's shape, a
//! balance that concurrent calls cannot overdraw, and a client that leaves mid-stream still
//! billed.

use std::time::Duration;

use futures_util::StreamExt;
use sandbase_gateway::config::{ApiSettings, ModelSettings, ProviderKind, ProviderSettings};
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};
use crate::store_upstream::{self, ANTHROPIC_SECRET, API_SECRET, OPENAI_SECRET, Seen};

fn model(id: &str, provider: &str, input: &str, output: &str) -> ModelSettings {
    ModelSettings {
        id: id.to_owned(),
        provider: provider.to_owned(),
        upstream: id.split('/').nth(1).unwrap().to_owned(),
        context_window: 100_000,
        max_output: 1000,
        input: input.to_owned(),
        cached_input: "1.25".to_owned(),
        cache_write: "3.75".to_owned(),
        output: output.to_owned(),
    }
}

fn provider(name: &str, kind: ProviderKind, base_url: String, secret: &str) -> ProviderSettings {
    let file = std::env::temp_dir().join(format!("sandbase-store-{}", uuid::Uuid::new_v4()));
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    ProviderSettings {
        name: name.to_owned(),
        kind,
        base_url,
        credential_env: None,
        credential_file: Some(file),
        credential_secret: None,
        timeout_secs: 30,
        connect_timeout_secs: 5,
    }
}

pub async fn store_app() -> (TestApp, Seen) {
    store_app_with(|_| {}).await
}

/// A gateway whose store leads to the stand-in, configured further by `configure`.
pub async fn store_app_with(
    configure: impl FnOnce(&mut sandbase_gateway::Settings),
) -> (TestApp, Seen) {
    let (upstream, seen) = store_upstream::start().await;
    let app = spawn_app_with(|settings| {
        configure(settings);
        let store = &mut settings.store;
        store.providers = vec![
            provider(
                "oa",
                ProviderKind::Openai,
                format!("{upstream}/v1"),
                OPENAI_SECRET,
            ),
            provider(
                "an",
                ProviderKind::Anthropic,
                upstream.clone(),
                ANTHROPIC_SECRET,
            ),
            provider(
                "wrong",
                ProviderKind::Openai,
                format!("{upstream}/v1"),
                "not-it",
            ),
        ];
        store.models = vec![
            model("openai/gpt-test", "oa", "2.50", "10"),
            model("anthropic/claude-test", "an", "3", "15"),
            model("openai/gpt-dear", "oa", "0", "2000"),
            model("openai/gpt-misconfigured", "wrong", "1", "1"),
        ];
        let api = |name: &str, secret: &str| {
            let file =
                provider(name, ProviderKind::Openai, upstream.clone(), secret).credential_file;
            ApiSettings {
                name: name.to_owned(),
                base_url: format!("{upstream}/api"),
                credential_env: None,
                credential_file: file,
                credential_secret: None,
                inject: sandbase_gateway::config::Injection::Query("key".to_owned()),
                price_per_call: "0.01".to_owned(),
                price_per_mib: "1".to_owned(),
                max_response_bytes: 4 * 1024 * 1024,
                timeout_secs: 30,
            }
        };
        store.apis = vec![api("search", API_SECRET), api("miskeyed", "not-it")];
    })
    .await;
    (app, seen)
}

pub async fn call(app: &TestApp, path: &str, key: &str, body: Value) -> reqwest::Response {
    app.http
        .post(format!("{}{path}", app.address))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

pub fn chat(model: &str, text: &str, stream: bool) -> Value {
    json!({ "model": model, "stream": stream, "max_tokens": 1000,
            "messages": [{ "role": "user", "content": text }] })
}

/// The store's record of a call, once it is settled.
pub async fn settled(app: &TestApp, response: &reqwest::Response) -> Value {
    let id = response.headers()["x-sandbase-store-request"]
        .to_str()
        .unwrap()
        .to_owned();
    let sql = format!(
        "SELECT json_build_object('cost', cost_micro, 'input', input_tokens, 'cached', cached_input_tokens, \
           'write', cache_write_tokens, 'output', output_tokens, 'estimated', estimated, 'status', status)::text \
         FROM store_requests WHERE id = '{id}'"
    );
    for _ in 0..200 {
        let row: Option<(String,)> = sqlx::query_as(&sql).fetch_optional(&app.db).await.unwrap();
        if let Some((row,)) = row {
            return serde_json::from_str(&row).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the call {id} was never settled")
}

pub async fn available(app: &TestApp, token: &str) -> i64 {
    app.get("/v1/billing/balance", token).await.body["available_micro"]
        .as_i64()
        .unwrap()
}

/// Reads a streamed answer to its end.
pub async fn text_of(response: reqwest::Response) -> String {
    String::from_utf8(response.bytes().await.unwrap().to_vec()).unwrap()
}

#[tokio::test]
async fn model_calls_are_forwarded_with_the_operators_key_and_metered_exactly() {
    let (app, seen) = store_app().await;
    let team = app.signup("store@example.com", "Store").await;
    let key = team.api_key.token.as_str();
    let before = available(&app, key).await;
    // Whole: 800 uncached × 2.50 + 200 cached × 1.25 + 50 out × 10 per million = 2750 micro.
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        key,
        chat("openai/gpt-test", "hi", false),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let record = settled(&app, &answer).await;
    let body: Value = answer.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from the stand-in"
    );
    assert_eq!(body["usage"]["prompt_tokens"], 1000);
    assert_eq!(
        (
            record["cost"].as_i64(),
            record["input"].as_i64(),
            record["cached"].as_i64()
        ),
        (Some(2750), Some(800), Some(200))
    );
    let (headers, sent) = seen.last().await;
    assert_eq!(headers["authorization"], format!("Bearer {OPENAI_SECRET}"));
    assert_eq!(sent["model"], "gpt-test");
    assert_eq!(available(&app, key).await, before - 2750);
    // Streamed without asking for usage: the gateway asks, and hides exactly that chunk.
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        key,
        chat("openai/gpt-test", "hi", true),
    )
    .await;
    let record = settled(&app, &answer).await;
    let text = text_of(answer).await;
    assert!(
        text.contains("stand-in") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    assert!(!text.contains("prompt_tokens"), "{text}");
    assert_eq!(seen.last().await.1["stream_options"]["include_usage"], true);
    assert_eq!(record["cost"], 2750);
    // Streamed asking for usage: the client gets it.
    let mut asked = chat("openai/gpt-test", "hi", true);
    asked["stream_options"] = json!({ "include_usage": true });
    let answer = call(&app, "/openai/v1/chat/completions", key, asked).await;
    let text = text_of(answer).await;
    assert!(text.contains("\"prompt_tokens\":1000"), "{text}");
    // Anthropic, streamed, with x-api-key: cache reads and writes apart, the last delta's
    // output (77, not 40 + 77): 100×3 + 30×1.25 + 20×3.75 + 77×15 = 300 + 37.5 + 75 + 1155.
    let answer = app
        .http
        .post(format!("{}/anthropic/v1/messages", app.address))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "test-beta")
        .json(&chat("anthropic/claude-test", "hi", true))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let record = settled(&app, &answer).await;
    assert!(text_of(answer).await.contains("message_stop"));
    assert_eq!(record["output"], 77);
    assert_eq!(record["cost"], 1568);
    let (headers, sent) = seen.last().await;
    assert_eq!(headers["x-api-key"], ANTHROPIC_SECRET);
    assert_eq!(headers["anthropic-beta"], "test-beta");
    assert_eq!(sent["model"], "claude-test");
    assert!(!format!("{headers:?}").contains(key));
    // Token counting is forwarded and free.
    let answer = call(
        &app,
        "/anthropic/v1/messages/count_tokens",
        key,
        chat("anthropic/claude-test", "hi", false),
    )
    .await;
    assert_eq!(answer.json::<Value>().await.unwrap()["input_tokens"], 42);
    let spent: i64 = app
        .count("SELECT sum(cost_micro)::bigint FROM store_requests")
        .await;
    assert_eq!(available(&app, key).await, before - spent);
}

/// A provider's 429, 500 and 529 pass through with their status, body and `Retry-After`;
/// the operator's refused key is a 502; none of them costs anything.
#[tokio::test]
async fn upstream_failures_pass_through_and_cost_nothing() {
    let (app, _) = store_app().await;
    let team = app.signup("upstream-fail@example.com", "Upstream").await;
    let key = team.api_key.token.as_str();
    // The provider's 429 passes through with its Retry-After, and costs nothing.
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        key,
        chat("openai/gpt-test", "busy", false),
    )
    .await;
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["retry-after"], "7");
    // A provider's 500, and Anthropic's 529 (overloaded), pass through as they came, free.
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        key,
        chat("openai/gpt-test", "broken", true),
    )
    .await;
    assert_eq!(answer.status(), 500);
    assert_eq!(answer.text().await.unwrap(), store_upstream::BROKEN);
    let answer = call(
        &app,
        "/anthropic/v1/messages",
        key,
        chat("anthropic/claude-test", "overloaded", false),
    )
    .await;
    assert_eq!(answer.status(), 529);
    assert_eq!(answer.headers()["retry-after"], "3");
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["type"], "overloaded_error", "{body}");
    // The operator's key refused: 502, said as such.
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        key,
        chat("openai/gpt-misconfigured", "hi", false),
    )
    .await;
    assert_eq!(answer.status(), 502);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_auth_failed");
    assert_eq!(app.count("SELECT count(*) FROM store_requests").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM ledger_transactions WHERE kind = 'debit'")
            .await,
        0
    );
}

#[tokio::test]
async fn refusals_come_in_each_familys_shape() {
    let (app, _) = store_app().await;
    let team = app.signup("refused@example.com", "Refused").await;
    let key = team.api_key.token.as_str();
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        key,
        chat("openai/nope", "hi", false),
    )
    .await;
    assert_eq!(answer.status(), 404);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    let answer = call(
        &app,
        "/anthropic/v1/messages",
        key,
        chat("anthropic/nope", "hi", false),
    )
    .await;
    let body: Value = answer.json().await.unwrap();
    assert_eq!(
        (body["type"].as_str(), body["error"]["type"].as_str()),
        (Some("error"), Some("not_found_error")),
        "{body}"
    );
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        "sb_nope",
        chat("openai/gpt-test", "hi", false),
    )
    .await;
    assert_eq!(answer.status(), 401);
    // The models of each family, in its shape.
    let listed: Value = app
        .http
        .get(format!("{}/openai/v1/models", app.address))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Its own three, and the Anthropic model chat completions reach through translation.
    assert_eq!(listed["data"].as_array().unwrap().len(), 4, "{listed}");
    let listed: Value = app
        .http
        .get(format!("{}/anthropic/v1/models", app.address))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Every model: the other family's through translation.
    assert_eq!(listed["data"][1]["id"], "anthropic/claude-test", "{listed}");
    assert_eq!(listed["data"].as_array().unwrap().len(), 4, "{listed}");
}

/// 50 concurrent streaming calls whose worst case is 2 credits each against 10 starter
/// credits (exactly 5 worst cases): at most 5 are admitted, the others are refused 402, and
/// the balance never goes below zero.
#[tokio::test]
async fn concurrent_calls_cannot_overdraw_the_balance() {
    let (app, _) = store_app().await;
    let team = app.signup("race@example.com", "Race").await;
    let key = team.api_key.token.clone();
    let calls = (0..50).map(|_| {
        let (app, key) = (&app, key.as_str());
        async move {
            let answer = call(
                app,
                "/openai/v1/chat/completions",
                key,
                chat("openai/gpt-dear", "slow", true),
            )
            .await;
            let status = answer.status().as_u16();
            let body = text_of(answer).await;
            (status, body)
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let admitted = answers.iter().filter(|(status, _)| *status == 200).count();
    for (status, body) in &answers {
        if *status != 200 {
            assert_eq!(*status, 402, "{body}");
            assert!(body.contains("insufficient_credits"), "{body}");
        }
    }
    assert!((1..=5).contains(&admitted), "{admitted} admitted");
    for _ in 0..100 {
        if app.count("SELECT count(*) FROM store_requests").await == admitted as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = available(&app, &key).await;
    assert!(left >= 0, "{left}");
    assert_eq!(left, 10_000_000 - admitted as i64 * 100_250);
}

/// A client that leaves after the first chunk is still billed for the whole call; a stream
/// that never reports usage is billed its reservation, marked estimated.
#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_still_billed() {
    let (app, _) = store_app().await;
    let team = app.signup("leaver@example.com", "Leaver").await;
    let key = team.api_key.token.as_str();
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        key,
        chat("openai/gpt-test", "slow", true),
    )
    .await;
    let id = answer.headers()["x-sandbase-store-request"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut chunks = answer.bytes_stream();
    assert!(chunks.next().await.unwrap().is_ok());
    drop(chunks);
    let sql = format!(
        "SELECT count(*) FROM store_requests WHERE id = '{id}' AND cost_micro = 2750 AND NOT estimated"
    );
    crate::testbed::wait_until("the call billed", Duration::from_secs(10), || async {
        app.count(&sql).await == 1
    })
    .await;
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        key,
        chat("openai/gpt-test", "no usage", true),
    )
    .await;
    let record = settled(&app, &answer).await;
    assert_eq!(record["estimated"], true);
    let audited = app
        .count("SELECT count(*) FROM audit_events WHERE action = 'store.call_estimated' AND actor_type = 'api_key'")
        .await;
    assert_eq!(audited, 1);
    // The reservation: 66 bytes of input at the dearest input price, 1000 out at 10.
    assert!(record["cost"].as_i64().unwrap() >= 10_000, "{record}");
}

/// SandBase's own view: the models with their prices, each call by its id (to its team
/// only), the calls listed, and usage grouped by model and by key.
#[tokio::test]
async fn the_store_view_shows_models_calls_and_usage_by_model() {
    let (app, _) = store_app().await;
    let team = app.signup("view@example.com", "View").await;
    let key = team.api_key.token.as_str();
    let other = app.signup("other@example.com", "Other").await;
    let models = app.get("/v1/store/models", key).await.body;
    assert_eq!(models["models"].as_array().unwrap().len(), 4, "{models}");
    assert_eq!(models["models"][0]["prices"]["input"], "2.5", "{models}");
    assert_eq!(models["models"][1]["family"], "anthropic");
    let answer = call(
        &app,
        "/openai/v1/chat/completions",
        key,
        chat("openai/gpt-test", "hi", false),
    )
    .await;
    let id = answer.headers()["x-sandbase-store-request"]
        .to_str()
        .unwrap()
        .to_owned();
    settled(&app, &answer).await;
    let record = app.get(&format!("/v1/store/requests/{id}"), key).await;
    assert_eq!(record.status, 200);
    assert_eq!(record.body["credits_micro"], 2750);
    assert_eq!(record.body["credits"], "0.00275");
    assert_eq!(record.body["tokens"]["cached_input"], 200);
    assert_eq!(record.body["api_key_id"], team.api_key.key.id.to_string());
    let foreign = app
        .get(&format!("/v1/store/requests/{id}"), &other.api_key.token)
        .await;
    foreign.assert_error(404, "not_found");
    let listed = app.get("/v1/store/requests?limit=10", key).await.body;
    assert_eq!(listed["requests"].as_array().unwrap().len(), 1);
    assert!(
        app.get("/v1/store/requests", &other.api_key.token)
            .await
            .body["requests"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    app.get("/v1/store/requests?limit=0", key)
        .await
        .assert_error(422, "invalid_request");
    let usage = app.get("/v1/usage?group_by=model", key).await.body;
    assert_eq!(usage["series"][0]["key"], "openai/gpt-test", "{usage}");
    assert_eq!(usage["series"][0]["amount_micro"], 2750);
    let usage = app.get("/v1/usage?group_by=key", key).await.body;
    assert_eq!(
        usage["series"][0]["key"],
        team.api_key.key.id.to_string(),
        "{usage}"
    );
}

/// A key restricted to some models calls only those; a key it makes is held to its list too.
#[tokio::test]
async fn keys_call_only_the_models_they_are_allowed() {
    let (app, _) = store_app().await;
    let team = app.signup("allowed@example.com", "Allowed").await;
    let owner = team.api_key.token.as_str();
    let created = app
        .post(
            "/v1/api-keys",
            owner,
            json!({ "name": "claude only", "allowed_models": ["anthropic/*"] }),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["allowed_models"], json!(["anthropic/*"]));
    let restricted = created.body["token"].as_str().unwrap().to_owned();
    let refused = call(
        &app,
        "/openai/v1/chat/completions",
        &restricted,
        chat("openai/gpt-test", "hi", false),
    )
    .await;
    assert_eq!(refused.status(), 403);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_allowed", "{body}");
    let allowed = call(
        &app,
        "/anthropic/v1/messages",
        &restricted,
        chat("anthropic/claude-test", "hi", false),
    )
    .await;
    assert_eq!(allowed.status(), 200);
    // Its child asks for every model, and still gets only its parent's.
    let child = app
        .post(
            "/v1/api-keys",
            &restricted,
            json!({ "name": "child", "allowed_models": ["*"] }),
        )
        .await;
    let child = child.body["token"].as_str().unwrap().to_owned();
    let refused = call(
        &app,
        "/openai/v1/chat/completions",
        &child,
        chat("openai/gpt-test", "hi", false),
    )
    .await;
    assert_eq!(refused.status(), 403);
    let listed = app.get("/v1/api-keys", owner).await.body;
    assert!(listed.to_string().contains("anthropic/*"), "{listed}");
    for bad in [json!([]), json!(["has space"]), json!(vec!["a"; 33])] {
        app.post(
            "/v1/api-keys",
            owner,
            json!({ "name": "bad", "allowed_models": bad }),
        )
        .await
        .assert_error(422, "invalid_request");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM api_keys WHERE name = 'bad'")
            .await,
        0
    );
}

/// A paid API: the operator's credential injected as a query parameter (the caller's own
/// `key` dropped, the caller's SandBase key never sent), priced per call and per MiB,
/// upstream failures and unknown names costing nothing.
#[tokio::test]
async fn paid_apis_are_forwarded_with_the_operators_credential_and_priced_per_call() {
    let (app, seen) = store_app().await;
    let team = app.signup("apis@example.com", "Apis").await;
    let key = team.api_key.token.as_str();
    let before = available(&app, key).await;
    let get = |path: &str| {
        app.http
            .get(format!("{}/store/apis/{path}", app.address))
            .bearer_auth(key)
            .send()
    };
    let answer = get("search/search?q=rust&key=attacker").await.unwrap();
    assert_eq!(answer.status(), 200);
    let record = settled(&app, &answer).await;
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["q"], "rust", "{body}");
    let (headers, sent) = seen.last().await;
    assert!(headers.get("authorization").is_none(), "{headers:?}");
    assert!(!sent.to_string().contains("attacker"), "{sent}");
    assert!(!body.to_string().contains("upstream-secret"));
    // 0.01 per call, 1 per MiB of the answer (rounded up).
    let small = record["cost"].as_i64().unwrap();
    assert!((10_001..=10_100).contains(&small), "{record}");
    let answer = get("search/big").await.unwrap();
    let record = settled(&app, &answer).await;
    assert_eq!(answer.bytes().await.unwrap().len(), 2 * 1024 * 1024);
    assert_eq!(record["cost"], 10_000 + 2_000_000);
    assert_eq!(available(&app, key).await, before - small - 2_010_000);
    // Free: the upstream's failure, an unknown API, a path that climbs, a refused credential.
    assert_eq!(get("search/fail").await.unwrap().status(), 500);
    let unknown: Value = get("nope/x").await.unwrap().json().await.unwrap();
    assert_eq!(unknown["error"]["code"], "api_not_found");
    assert_eq!(get("search/x%2F..%2Fsecret").await.unwrap().status(), 422);
    let refused: Value = get("miskeyed/search").await.unwrap().json().await.unwrap();
    assert_eq!(refused["error"]["code"], "upstream_auth_failed");
    assert_eq!(
        app.count("SELECT count(*) FROM store_requests WHERE kind = 'api'")
            .await,
        2
    );
    assert_eq!(available(&app, key).await, before - small - 2_010_000);
    let listed = app.get("/v1/store/apis", key).await.body;
    assert_eq!(listed["apis"][0]["price_per_call"], "0.01", "{listed}");
}
