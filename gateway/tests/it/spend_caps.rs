//! Spend caps: a sandbox's own, a key's and its ancestors' — each stops what it covers when
//! it is reached, and is never exceeded: usage past a cap is not charged.

use std::time::Duration;

use reqwest::StatusCode;
use sandbase_api::internal::UsageReport;
use serde_json::json;

use crate::testbed::{TestWorker, all_metered, create_ok, sh, wait_until, worker_config};
use crate::usage::{assert_ledger_consistent, event, report_as_worker, usage_app};

/// Spend caps: a sandbox stops at its own `max_credits`; a key at its cap gets 402
/// `spend_cap_reached` and its running sandboxes stop, while the team's other keys work.
#[tokio::test(flavor = "multi_thread")]
async fn spend_caps_stop_sandboxes_and_refuse_keys_at_their_cap() {
    let app = usage_app().await;
    let worker = TestWorker::start(worker_config(&app, "w", 6, 0)).await;
    let alice = app.signup(&crate::helpers::email("alice"), "Alice").await;
    let token = alice.api_key.token.as_str();

    // 15 micro-credits a second: a cap of 0.00003 is two seconds.
    let capped = create_ok(&app, token, json!({ "max_credits": "0.00003" })).await;
    let free = create_ok(&app, token, json!({})).await;
    wait_until("the sandbox's cap", Duration::from_secs(20), || async {
        app.get(&format!("/v1/sandboxes/{capped}"), token)
            .await
            .body["stop_reason"]
            == "spend_cap"
    })
    .await;
    let answer = app
        .get(&format!("/v1/sandboxes/{capped}"), token)
        .await
        .body;
    assert!(answer["spent_micro"].as_i64().unwrap() >= 30, "{answer}");
    assert_eq!(answer["max_credits_micro"], 30);
    assert_eq!(
        sh(&app, token, &free, "echo fine").await["stdout"],
        "fine\n"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM audit_events WHERE action = 'sandbox.stop_spend_cap'")
            .await,
        1
    );
    app.post("/v1/sandboxes", token, json!({ "max_credits": "-1" }))
        .await
        .assert_error(422, "invalid_request");

    // A key capped at 0.0012 credits: its first sandbox reserves a minute (900), a second
    // one does not fit in what is left; once the first sandbox's usage (a GiB of egress,
    // reported by its worker) passes the cap, it stops.
    let (_, capped_key) = app
        .create_key(token, json!({ "name": "agent", "max_credits": "0.0012" }))
        .await;
    let listed = app.get("/v1/api-keys", token).await.body;
    assert!(
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|key| key["max_credits_micro"] == 1200)
    );
    let by_key = create_ok(&app, &capped_key, json!({})).await;
    app.post("/v1/sandboxes", &capped_key, json!({}))
        .await
        .assert_error(402, "spend_cap_reached");
    let (status, receipt) = report_as_worker(
        &app,
        &UsageReport {
            worker: worker.config.worker_id.clone(),
            samples: Vec::new(),
            events: vec![event(
                by_key.parse().unwrap(),
                "egress-big",
                "egress_bytes",
                "",
                1 << 30,
            )],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        (status, receipt["events"].as_u64()),
        (StatusCode::OK, Some(1))
    );
    wait_until("the key's cap", Duration::from_secs(20), || async {
        app.get(&format!("/v1/sandboxes/{by_key}"), token)
            .await
            .body["stop_reason"]
            == "spend_cap"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    app.post("/v1/sandboxes", &capped_key, json!({}))
        .await
        .assert_error(402, "spend_cap_reached");
    // The team's own key is not capped.
    let other = create_ok(&app, token, json!({})).await;
    for id in [&free, &other] {
        assert_eq!(
            app.delete(&format!("/v1/sandboxes/{id}"), token)
                .await
                .status,
            StatusCode::NO_CONTENT
        );
    }
    wait_until("the last charges", Duration::from_secs(15), || async {
        all_metered(&app).await
    })
    .await;
    assert_ledger_consistent(&app).await;
    worker.clean_up().await;
}

/// Two children of a key capped at 0.0012 credits each inherit the whole cap; together they
/// may not spend more than their parent: the first child's sandbox reserves a minute (900),
/// the second child's does not fit in what the parent has left; what the first child's
/// sandbox spends is counted against the parent, up to the parent's cap and never past it
/// (the rest is not charged), and there it stops.
#[tokio::test(flavor = "multi_thread")]
async fn children_spend_against_their_parents_cap() {
    let app = usage_app().await;
    let worker = TestWorker::start(worker_config(&app, "w", 4, 0)).await;
    let alice = app.signup(&crate::helpers::email("spend"), "Spend").await;
    let token = alice.api_key.token.as_str();
    let (parent_id, parent) = app
        .create_key(token, json!({ "name": "agent", "max_credits": "0.0012" }))
        .await;
    let (_, first) = app.create_key(&parent, json!({ "name": "one" })).await;
    let (_, second) = app.create_key(&parent, json!({ "name": "two" })).await;
    let sandbox = create_ok(&app, &first, json!({})).await;
    app.post("/v1/sandboxes", &second, json!({}))
        .await
        .assert_error(402, "spend_cap_reached");
    // A GiB of egress (0.05 credits) by the first child's sandbox: charged to the child and
    // counted against the parent as far as the parent's cap goes, which stops the sandbox.
    let usage = UsageReport {
        worker: worker.config.worker_id.clone(),
        events: vec![event(
            sandbox.parse().unwrap(),
            "egress-child",
            "egress_bytes",
            "",
            1 << 30,
        )],
        ..Default::default()
    };
    assert_eq!(report_as_worker(&app, &usage).await.0, StatusCode::OK);
    wait_until("the parent's cap", Duration::from_secs(20), || async {
        app.get(&format!("/v1/sandboxes/{sandbox}"), token)
            .await
            .body["stop_reason"]
            == "spend_cap"
    })
    .await;
    let parent_key = app
        .get(&format!("/v1/api-keys/{parent_id}"), token)
        .await
        .body;
    assert_eq!(parent_key["spent_micro"], 1200, "{parent_key}");
    let forgiven = app
        .count(&format!(
            "SELECT coalesce(sum((details->>'forgiven_micro')::bigint), 0)::bigint \
             FROM ledger_transactions WHERE team_id = '{}'",
            alice.team.id
        ))
        .await;
    assert!(forgiven >= 48_000, "{forgiven}");
    // The team's own key is not held by the agent's cap.
    let own = create_ok(&app, token, json!({})).await;
    let answer = app.delete(&format!("/v1/sandboxes/{own}"), token).await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    worker.clean_up().await;
}
