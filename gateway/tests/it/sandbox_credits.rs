//! Credits and running sandboxes: admission under concurrency, runtime charges, and stops at
//! zero credits after the grace period.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::testbed::{
    LIMITS, NODE_TOKEN, TestWorker, all_metered, create_ok, sh, wait_until, worker_config,
};
/// A team whose credits cover ten first minutes: of 100 concurrent creates, ten are
/// admitted, the others get 402, and nothing is spent beyond what was admitted.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_creates_are_admitted_only_as_far_as_credits_go() {
    let app = crate::helpers::spawn_app_with(|settings| {
        settings.workers.node_token = Some(NODE_TOKEN.to_owned().into());
        settings.sandboxes.default_template = "busybox".to_owned();
        settings.sandboxes.default_resources.memory_mb = LIMITS.memory_mb;
        settings.sandboxes.default_resources.disk_mb = LIMITS.disk_mb;
        settings.sandboxes.default_resources.pids = LIMITS.pids;
        // 1 vCPU and 128 MB: 14 + 1 micro-credits a second, 900 for a first minute.
        settings.billing.starter_credits = "0.009".to_owned();
    })
    .await;
    let worker = TestWorker::start(worker_config(&app, "w", 14, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.clone();
    // Wait for the worker without spending a reservation: the list of templates.
    wait_until("the worker", Duration::from_secs(20), || async {
        let list = app.get("/v1/templates", &token).await.body;
        list["templates"]
            .as_array()
            .is_some_and(|templates| !templates.is_empty())
    })
    .await;
    let mut requests = Vec::new();
    for _ in 0..100 {
        let (http, url, token) = (
            app.http.clone(),
            format!("{}/v1/sandboxes", app.address),
            token.clone(),
        );
        requests.push(tokio::spawn(async move {
            let response = http
                .post(url)
                .bearer_auth(token)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            (status, body)
        }));
    }
    let mut admitted = Vec::new();
    let mut refused = 0;
    for request in requests {
        let (status, body) = request.await.unwrap();
        match status {
            StatusCode::CREATED => admitted.push(body["id"].as_str().unwrap().to_owned()),
            StatusCode::PAYMENT_REQUIRED => {
                assert_eq!(body["error"]["code"], "insufficient_credits");
                refused += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!((admitted.len(), refused), (10, 90));
    // The admitted first minutes are held, and shown, until charges replace them.
    let balance = app.get("/v1/billing/balance", &token).await.body;
    assert_eq!(balance["reserved_micro"], 9000, "{balance}");
    for id in &admitted {
        assert_eq!(
            app.delete(&format!("/v1/sandboxes/{id}"), &token)
                .await
                .status,
            StatusCode::NO_CONTENT
        );
    }
    // Every admitted sandbox's runtime is charged up to its last sample (taken when it was
    // destroyed); the balance is below zero by less than one reservation (here it stays above).
    wait_until(
        "the last runtime charges",
        Duration::from_secs(15),
        || async { all_metered(&app).await },
    )
    .await;
    let available = app.get("/v1/billing/balance", &token).await.body["available_micro"]
        .as_i64()
        .unwrap();
    assert!(available > -900 && available < 9000, "{available}");
    let mut connection = app.db.acquire().await.unwrap();
    assert!(
        sandbase_billing::reconcile(&mut connection)
            .await
            .unwrap()
            .is_empty()
    );
    drop(connection);
    worker.clean_up().await;
}

/// Runtime is charged while a sandbox runs and up to when it stops, each charge traceable
/// to its sandbox and interval; at zero credits, running sandboxes stop after the grace
/// period and new ones are refused.
#[tokio::test(flavor = "multi_thread")]
async fn runtime_is_charged_and_zero_credits_stop_sandboxes_after_the_grace_period() {
    let app = crate::helpers::spawn_app_with(|settings| {
        settings.workers.node_token = Some(NODE_TOKEN.to_owned().into());
        settings.sandboxes.default_template = "busybox".to_owned();
        settings.sandboxes.default_resources.memory_mb = LIMITS.memory_mb;
        settings.sandboxes.default_resources.disk_mb = LIMITS.disk_mb;
        settings.sandboxes.default_resources.pids = LIMITS.pids;
        settings.billing.grace_secs = 2;
        settings.billing.charge_every_secs = 1;
    })
    .await;
    let worker = TestWorker::start(worker_config(&app, "w", 4, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    let created = std::time::Instant::now();
    let id = create_ok(&app, token, json!({})).await;
    // Charged as it runs: at least 5 s of runtime arrive (however loaded the machine), and
    // never more than the time it has existed.
    let charges = || async {
        let rows: Vec<(serde_json::Value,)> = sqlx::query_as(
            "SELECT t.details FROM ledger_transactions t WHERE t.kind = 'debit' AND t.details->>'sandbox' = $1",
        )
        .bind(&id)
        .fetch_all(&app.db)
        .await
        .unwrap();
        rows
    };
    let charged_ms = |rows: &[(serde_json::Value,)]| -> i64 {
        rows.iter()
            .map(|(details,)| details["milliseconds"].as_i64().unwrap())
            .sum()
    };
    wait_until(
        "5 s of runtime charged",
        Duration::from_secs(20),
        || async { charged_ms(&charges().await) >= 5000 },
    )
    .await;
    let rows = charges().await;
    let lived_ms = created.elapsed().as_millis() as i64;
    assert!(!rows.is_empty(), "a running sandbox is charged");
    assert_eq!(rows[0].0["price_per_second_micro"], 15);
    let charged_ms = charged_ms(&rows);
    assert!(
        (5000..=lived_ms).contains(&charged_ms),
        "{charged_ms} ms charged after {lived_ms} ms"
    );

    // Zero credits: the sandbox keeps running for the grace period, then stops.
    let team = alice.team.id;
    let available = app.get("/v1/billing/balance", token).await.body["available_micro"]
        .as_i64()
        .unwrap();
    let mut transaction = app.db.begin().await.unwrap();
    sandbase_billing::debit(
        &mut transaction,
        sandbase_billing::Debit {
            team_id: team,
            amount: sandbase_billing::Credits(available),
            idempotency_key: "spend-it-all".to_owned(),
            description: "test".to_owned(),
            details: json!({}),
        },
    )
    .await
    .unwrap();
    transaction.commit().await.unwrap();
    assert_eq!(
        sh(&app, token, &id, "echo still").await["stdout"],
        "still\n"
    );
    wait_until("the stop at zero", Duration::from_secs(15), || async {
        app.get(&format!("/v1/sandboxes/{id}"), token).await.body["stop_reason"]
            == "insufficient_credits"
    })
    .await;
    assert_eq!(
        app.count(
            "SELECT count(*) FROM audit_events WHERE action = 'sandbox.stop_insufficient_credits'"
        )
        .await,
        1
    );
    app.post("/v1/sandboxes", token, json!({}))
        .await
        .assert_error(402, "insufficient_credits");
    wait_until("the final charge", Duration::from_secs(10), || async {
        all_metered(&app).await
    })
    .await;
    let mut connection = app.db.acquire().await.unwrap();
    assert!(
        sandbase_billing::reconcile(&mut connection)
            .await
            .unwrap()
            .is_empty()
    );
    drop(connection);
    worker.clean_up().await;
}

/// A team cannot hold a whole node: at most its quota of sandboxes at once, even when it
/// asks for many at the same moment; other teams are served; the operator sets a team's own.
#[tokio::test(flavor = "multi_thread")]
async fn a_team_holds_at_most_its_quota_of_sandboxes() {
    let app = crate::helpers::spawn_app_with(|settings| {
        crate::testbed::configure_sandboxes(settings);
        settings.sandboxes.max_per_team = 3;
    })
    .await;
    let worker = TestWorker::start(worker_config(&app, "w", 10, 0)).await;
    let greedy = app.signup(&crate::helpers::email("greedy"), "Greedy").await;
    let token = greedy.api_key.token.as_str();
    let mut held = vec![create_ok(&app, token, json!({})).await];
    // Many at once: no more than the quota in all.
    let attempts: Vec<_> = (0..8)
        .map(|_| app.post("/v1/sandboxes", token, json!({})))
        .collect();
    let mut refused = 0;
    for answer in futures_util::future::join_all(attempts).await {
        match answer.status {
            StatusCode::CREATED => held.push(answer.body["id"].as_str().unwrap().to_owned()),
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(answer.code(), "sandbox_quota_reached", "{}", answer.body);
                refused += 1;
            }
            other => panic!("{other}: {}", answer.body),
        }
    }
    assert_eq!((held.len(), refused), (3, 6));
    // Another team is served.
    let other = app.signup(&crate::helpers::email("other"), "Other").await;
    let theirs = create_ok(&app, &other.api_key.token, json!({})).await;
    // The operator gives the team a quota of its own.
    sandbase_gateway::operator::set_team_sandbox_quota(&app.db, greedy.team.id, Some(4))
        .await
        .unwrap();
    held.push(create_ok(&app, token, json!({})).await);
    app.post("/v1/sandboxes", token, json!({}))
        .await
        .assert_error(429, "sandbox_quota_reached");
    // A destroyed sandbox makes room again.
    let freed = held.pop().unwrap();
    app.delete(&format!("/v1/sandboxes/{freed}"), token).await;
    held.push(create_ok(&app, token, json!({})).await);
    for id in &held {
        app.delete(&format!("/v1/sandboxes/{id}"), token).await;
    }
    app.delete(&format!("/v1/sandboxes/{theirs}"), &other.api_key.token)
        .await;
    worker.clean_up().await;
}
