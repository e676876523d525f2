//! A stolen worker credential: whoever holds what one node holds tries to pass for another
//! worker (registering as it, which would mark its sandboxes lost; heartbeating as it;
//! reporting usage for its sandboxes, which would bill their team), to call another worker
//! directly, and to use the operator's routes. Every attempt is refused, and the real worker
//! and its sandbox carry on.

use reqwest::StatusCode;
use sandbase_api::internal::{NODE_TOKEN_HEADER, UsageReport, UsageSample};
use serde_json::json;

use crate::helpers::TestApp;
use crate::testbed::{TestWorker, create_ok, sandbox_app, sh, worker_config, worker_credential};

async fn internal_post(
    app: &TestApp,
    path: &str,
    credential: &str,
    body: serde_json::Value,
) -> StatusCode {
    app.internal_http
        .post(format!("{}{path}", app.internal))
        .header(NODE_TOKEN_HEADER, credential)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stolen_worker_credential_cannot_pass_for_another_worker_or_the_operator() {
    let app = sandbox_app().await;
    let worker = TestWorker::start(worker_config(&app, "victim", 2, 0)).await;
    let victim_id = worker.config.worker_id.clone();
    let victim_url = format!("https://{}", worker.running().local_addr());
    let owner = app.signup("victim@example.com", "Victim").await;
    let token = owner.api_key.token.as_str();
    let sandbox = create_ok(&app, token, json!({})).await;
    // What the attacker holds: the credential of a node of its own.
    let stolen = worker_credential("thief");
    assert_eq!(
        internal_post(
            &app,
            "/internal/v1/workers/register",
            &stolen,
            json!({
                "id": "thief", "url": "http://127.0.0.1:9", "capacity": 1, "templates": []
            })
        )
        .await,
        StatusCode::NO_CONTENT
    );
    // Registering as the victim (which would mark its sandboxes lost) is refused…
    let register = json!({
        "id": victim_id, "url": "http://127.0.0.1:9", "capacity": 1, "templates": []
    });
    assert_eq!(
        internal_post(&app, "/internal/v1/workers/register", &stolen, register).await,
        StatusCode::FORBIDDEN
    );
    // …as are its heartbeats…
    let heartbeat = json!({
        "id": victim_id, "url": "http://127.0.0.1:9", "capacity": 1, "templates": [],
        "sandboxes": []
    });
    assert_eq!(
        internal_post(&app, "/internal/v1/workers/heartbeat", &stolen, heartbeat).await,
        StatusCode::FORBIDDEN
    );
    // …and usage reported for its sandbox, which would bill the victim's team.
    let balance = app.get("/v1/billing/balance", token).await.body["available_micro"].clone();
    let report = UsageReport {
        worker: victim_id.clone(),
        samples: vec![UsageSample {
            sandbox: sandbox.parse().unwrap(),
            seq: 1_000_000,
            uptime_ms: 3_600_000_000,
            cpu_usec: 3_600_000_000_000,
            paused_ms: 0,
            last: false,
            sampled_at: chrono::Utc::now(),
        }],
        ..Default::default()
    };
    assert_eq!(
        internal_post(
            &app,
            "/internal/v1/usage",
            &stolen,
            serde_json::to_value(&report).unwrap()
        )
        .await,
        StatusCode::FORBIDDEN
    );
    // The operator's routes are not a worker's.
    let grant = app
        .post(
            &format!("/v1/admin/teams/{}/grants", owner.team.id),
            &stolen,
            json!({ "credits": "1000" }),
        )
        .await;
    grant.assert_error(401, "invalid_operator_token");
    // Another worker does not take this credential either.
    let direct = app
        .internal_http
        .delete(format!("{victim_url}/internal/v1/sandboxes/{sandbox}"))
        .header(NODE_TOKEN_HEADER, &stolen)
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), StatusCode::UNAUTHORIZED);
    // Nothing happened to the victim.
    assert_eq!(
        sh(&app, token, &sandbox, "echo alive").await["stdout"],
        "alive\n"
    );
    assert_eq!(
        app.get("/v1/billing/balance", token).await.body["available_micro"],
        balance
    );
    app.delete(&format!("/v1/sandboxes/{sandbox}"), token).await;
    worker.clean_up().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_travel_to_workers_only_over_tls() {
    // A deployment whose internal channel has no TLS: its worker is reached over plain HTTP.
    let app = crate::helpers::spawn_app_with(|settings| {
        crate::testbed::configure_sandboxes(settings);
        settings.internal_tls = None;
        settings.vault.keys = vec![sandbase_vault::Keyring::generate_entry(1).into()];
    })
    .await;
    assert!(app.internal.starts_with("http://"));
    let worker = TestWorker::start(worker_config(&app, "plain", 2, 0)).await;
    let owner = app.signup("plain@example.com", "Plain").await;
    let token = owner.api_key.token.as_str();
    let secret = json!({
        "name": "api", "value": "sk-live-0123456789abcdef", "hosts": ["api.test.example"],
        "inject": { "header": "Authorization", "format": "Bearer {value}" }
    });
    assert_eq!(app.post("/v1/secrets", token, secret).await.status, 201);
    // A sandbox that would carry the credential is refused before anything is sent…
    let body = json!({ "egress": { "allow": ["api.test.example"] }, "credentials": ["api"] });
    let refused = crate::testbed::create(&app, token, body).await;
    refused.assert_error(503, "no_secure_worker");
    assert_eq!(
        app.count("SELECT count(*) FROM sandboxes").await,
        0,
        "nothing was written"
    );
    // …while sandboxes without credentials are served as before.
    let sandbox = create_ok(&app, token, json!({})).await;
    assert_eq!(
        sh(&app, token, &sandbox, "echo fine").await["stdout"],
        "fine\n"
    );
    app.delete(&format!("/v1/sandboxes/{sandbox}"), token).await;
    worker.clean_up().await;

    // With TLS, the internal listener speaks nothing else: plain HTTP gets no answer, and a
    // client that does not trust the channel's CA cannot connect.
    let secure = crate::helpers::spawn_app().await;
    let plain_url = secure.internal.replacen("https://", "http://", 1);
    let plain = secure.http.get(format!("{plain_url}/metrics")).send().await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
    let untrusting = reqwest::Client::new()
        .get(format!("{}/metrics", secure.internal))
        .send()
        .await;
    assert!(untrusting.is_err(), "a client without the CA got through");
    let trusting = secure
        .internal_http
        .get(format!("{}/metrics", secure.internal))
        .send()
        .await
        .unwrap();
    assert!(trusting.status().is_success());
}

/// A stolen worker credential cannot attract sandboxes by over-reporting: a registration
/// past `workers.max_capacity` is refused, a heartbeat is held to the capacity its worker
/// registered and to the memory and CPU of its first report, and a worker cannot look emptier
/// than the gateway knows it is.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_cannot_claim_more_than_it_registered() {
    let app = sandbox_app().await;
    let thief = worker_credential("greedy");
    let register = |capacity: u32| json!({ "id": "greedy", "url": "http://127.0.0.1:9", "capacity": capacity, "templates": [] });
    assert_eq!(
        internal_post(
            &app,
            "/internal/v1/workers/register",
            &thief,
            register(1_000_000)
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        internal_post(&app, "/internal/v1/workers/register", &thief, register(2)).await,
        StatusCode::NO_CONTENT
    );
    let beat = |capacity: u32, memory: u64| {
        json!({
            "id": "greedy", "url": "http://127.0.0.1:9", "capacity": capacity, "templates": [],
            "sandboxes": [], "memory_mb": memory, "cpu_millis": 2000
        })
    };
    let heartbeat = "/internal/v1/workers/heartbeat";
    assert_eq!(
        internal_post(&app, heartbeat, &thief, beat(2, 4096)).await,
        StatusCode::OK
    );
    assert_eq!(
        internal_post(&app, heartbeat, &thief, beat(500, 1 << 30)).await,
        StatusCode::OK
    );
    let claims = app.state.worker_claims("greedy").await.unwrap();
    assert_eq!(claims, Some((2, 0, 4096, 2000)));
}
