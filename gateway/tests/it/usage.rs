//! Usage in, charges out: samples and events reported the way workers report them (to the
//! real internal route, into real PostgreSQL), a real worker killed mid-sandbox, and operator
//! grants over HTTP (spend caps: `spend_caps.rs`).

use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use sandbase_api::internal::{UsageEvent, UsageReport, UsageSample};
use sandbase_gateway::config::Price;
use sandbase_gateway::testing::OPERATOR_TOKEN;
use sandbase_worker::service;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{TestApp, spawn_app_with};
use crate::testbed::{
    NODE_TOKEN, TestWorker, all_metered, create_ok, sh, wait_until, worker_config,
};

pub(crate) async fn usage_app() -> TestApp {
    spawn_app_with(|settings| {
        crate::testbed::configure_sandboxes(settings);
        settings.workers.heartbeat_ttl_secs = 3;
        settings.workers.lost_after_secs = 3;
        settings.billing.cpu_second_micro = 5;
        settings.billing.charge_every_secs = 1;
        settings.billing.prices = vec![
            Price {
                kind: "egress_bytes".to_owned(),
                subject: "*".to_owned(),
                micro: 50_000,
                per: 1 << 30,
            },
            Price {
                kind: "api_calls".to_owned(),
                subject: "search".to_owned(),
                micro: 1000,
                per: 1,
            },
        ];
    })
    .await
}

pub(crate) async fn assert_ledger_consistent(app: &TestApp) {
    let mut connection = app.db.acquire().await.unwrap();
    let mismatches = sandbase_billing::reconcile(&mut connection).await.unwrap();
    assert!(mismatches.is_empty(), "{mismatches:?}");
    let unbalanced = app
        .count(
            "SELECT count(*) FROM (SELECT transaction_id FROM ledger_entries \
             GROUP BY transaction_id HAVING sum(amount) <> 0) t",
        )
        .await;
    assert_eq!(unbalanced, 0);
}

/// Reports usage with the credential of the worker the report names.
pub(crate) async fn report_as_worker(app: &TestApp, usage: &UsageReport) -> (StatusCode, Value) {
    report(
        app,
        &crate::testbed::worker_credential(&usage.worker),
        usage,
    )
    .await
}

async fn report(app: &TestApp, token: &str, report: &UsageReport) -> (StatusCode, Value) {
    let response = app
        .internal_http
        .post(format!("{}/internal/v1/usage", app.internal))
        .header(sandbase_api::internal::NODE_TOKEN_HEADER, token)
        .json(report)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A sandbox as the gateway records one it placed on worker `worker`: 1 vCPU and 1 GiB,
/// so 14 + 5 = 19 micro-credits a second, and 5 per CPU-second.
async fn placed_sandbox(app: &TestApp, team: Uuid, worker: &str) -> Uuid {
    sqlx::query(
        "INSERT INTO workers (id, url, capacity) VALUES ($1, 'http://127.0.0.1:9', 4) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(worker)
    .execute(&app.db)
    .await
    .unwrap();
    let id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO sandboxes (id, team_id, template, state, worker_id, cwd, cpu_millis, memory_mb, \
           disk_mb, pids, expires_at) \
         VALUES ($1, $2, 'busybox', 'running', $3, '/work', 1000, 1024, 64, 64, now() + interval '1 hour')",
    )
    .bind(id)
    .bind(team)
    .bind(worker)
    .execute(&app.db)
    .await
    .unwrap();
    id
}

fn sample(sandbox: Uuid, seq: u64, last: bool) -> UsageSample {
    UsageSample {
        sandbox,
        seq,
        uptime_ms: seq * 1000,
        cpu_usec: seq * 100_000,
        paused_ms: 0,
        last,
        sampled_at: Utc::now(),
    }
}

pub(crate) fn event(
    sandbox: Uuid,
    key: &str,
    kind: &str,
    subject: &str,
    quantity: u64,
) -> UsageEvent {
    UsageEvent {
        key: key.to_owned(),
        sandbox,
        kind: kind.to_owned(),
        subject: subject.to_owned(),
        quantity,
        occurred_at: Utc::now(),
    }
}

async fn charged_for(app: &TestApp, sandbox: Uuid) -> i64 {
    let (total,): (Option<i64>,) = sqlx::query_as(
        "SELECT (-sum(e.amount))::bigint FROM ledger_transactions t \
         JOIN ledger_entries e ON e.transaction_id = t.id AND e.account = 'team:' || t.team_id \
         WHERE t.kind = 'debit' AND t.details->>'sandbox' = $1",
    )
    .bind(sandbox.to_string())
    .fetch_one(&app.db)
    .await
    .unwrap();
    total.unwrap_or(0)
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
/// Samples resent, reordered and sent concurrently are charged once, for the highest
/// counters; events are priced from the table and charged once per key; bad reports are
/// refused whole, with nothing written.
#[tokio::test(flavor = "multi_thread")]
async fn duplicate_and_out_of_order_usage_is_charged_exactly_once() {
    let app = usage_app().await;
    let alice = app.signup(&crate::helpers::email("alice"), "Alice").await;
    let token = alice.api_key.token.as_str();
    let worker = format!("usage-{}", Uuid::new_v4().simple());
    let sandbox = placed_sandbox(&app, alice.team.id, &worker).await;

    let batches: Vec<Vec<UsageSample>> = vec![
        vec![
            sample(sandbox, 1, false),
            sample(sandbox, 2, false),
            sample(sandbox, 3, false),
        ],
        vec![
            sample(sandbox, 3, false),
            sample(sandbox, 2, false),
            sample(sandbox, 1, false),
        ],
        vec![
            sample(sandbox, 7, false),
            sample(sandbox, 5, false),
            sample(sandbox, 6, false),
        ],
        vec![
            sample(sandbox, 10, true),
            sample(sandbox, 9, false),
            sample(sandbox, 8, false),
        ],
        vec![sample(sandbox, 4, false), sample(sandbox, 10, true)],
    ];
    let mut sends = Vec::new();
    for round in 0..3 {
        for batch in &batches {
            let (app_http, address, worker, batch) = (
                app.internal_http.clone(),
                app.internal.clone(),
                worker.clone(),
                batch.clone(),
            );
            sends.push(tokio::spawn(async move {
                if round > 0 {
                    tokio::time::sleep(Duration::from_millis(300 * round)).await;
                }
                app_http
                    .post(format!("{address}/internal/v1/usage"))
                    .header(
                        sandbase_api::internal::NODE_TOKEN_HEADER,
                        crate::testbed::worker_credential(&worker),
                    )
                    .json(&UsageReport {
                        worker,
                        samples: batch,
                        events: Vec::new(),
                        ..Default::default()
                    })
                    .send()
                    .await
                    .unwrap()
                    .status()
            }));
        }
    }
    for send in sends {
        assert_eq!(send.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM usage_samples WHERE sandbox_id = '{sandbox}'"
        ))
        .await,
        10
    );
    wait_until("the samples' charge", Duration::from_secs(10), || async {
        app.count("SELECT count(*) FROM usage_samples WHERE NOT processed")
            .await
            == 0
            && all_metered(&app).await
            && app
                .count(&format!(
                    "SELECT count(*) FROM sandboxes WHERE id = '{sandbox}' AND metered_final"
                ))
                .await
                == 1
    })
    .await;
    // 10 s at 19 a second, plus 1 CPU-second at 5: once, whatever came twice or late.
    assert_eq!(charged_for(&app, sandbox).await, 195);
    let (spent, metered_ms): (i64, i64) =
        sqlx::query_as("SELECT spent_micro, metered_ms FROM sandboxes WHERE id = $1")
            .bind(sandbox)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((spent, metered_ms), (195, 10_000));
    // Every charge names the samples it covers; together, all ten.
    let details: Vec<(Value,)> = sqlx::query_as(
        "SELECT details FROM ledger_transactions WHERE details->>'sandbox' = $1 AND kind = 'debit'",
    )
    .bind(sandbox.to_string())
    .fetch_all(&app.db)
    .await
    .unwrap();
    let charged_ms: i64 = details
        .iter()
        .map(|(d,)| d["milliseconds"].as_i64().unwrap())
        .sum();
    assert_eq!(charged_ms, 10_000);
    let mut covered: Vec<i64> = details
        .iter()
        .flat_map(|(d,)| {
            let range = d["samples"].as_array().unwrap();
            range[0].as_i64().unwrap()..=range[1].as_i64().unwrap()
        })
        .collect();
    covered.sort_unstable();
    assert_eq!(covered, (1..=10).collect::<Vec<i64>>());
    // Events: two GiB of egress (one resent) and three priced API calls.
    let events = vec![
        event(sandbox, "egress-1", "egress_bytes", "", 1 << 30),
        event(sandbox, "egress-2", "egress_bytes", "", 1 << 30),
        event(sandbox, "egress-1", "egress_bytes", "", 1 << 30),
        event(sandbox, "call-1", "api_calls", "search", 1),
        event(sandbox, "call-2", "api_calls", "search", 1),
        event(sandbox, "call-3", "api_calls", "search", 1),
    ];
    for _ in 0..2 {
        let (status, receipt) = report_as_worker(
            &app,
            &UsageReport {
                worker: worker.clone(),
                samples: Vec::new(),
                events: events.clone(),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{receipt}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM usage_events").await,
        5,
        "a resent key is one event"
    );
    wait_until("the events' charge", Duration::from_secs(10), || async {
        app.count("SELECT count(*) FROM usage_events WHERE transaction_id IS NULL")
            .await
            == 0
    })
    .await;
    assert_eq!(charged_for(&app, sandbox).await, 195 + 100_000 + 3000);
    let by_kind = app.get("/v1/usage?group_by=kind", token).await.body;
    let amount_of = |kind: &str| {
        by_kind["series"]
            .as_array()
            .unwrap()
            .iter()
            .find(|point| point["key"] == kind)
            .map(|point| point["amount_micro"].as_i64().unwrap())
    };
    assert_eq!(amount_of("runtime"), Some(195));
    assert_eq!(amount_of("egress_bytes"), Some(100_000));
    assert_eq!(amount_of("api_calls"), Some(3000));
    // Stacked: each day split by kind, the same amounts.
    let stacked = app
        .get("/v1/usage?group_by=day&split_by=kind", token)
        .await
        .body;
    let split_of = |kind: &str| {
        stacked["series"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|point| point["split"] == kind)
            .map(|point| point["amount_micro"].as_i64().unwrap())
            .sum::<i64>()
    };
    assert_eq!(split_of("runtime"), 195);
    assert_eq!(split_of("egress_bytes"), 100_000);
    assert_eq!(stacked["total_micro"], by_kind["total_micro"]);
    for refused in [
        "split_by=day",
        "split_by=kind&group_by=kind",
        "split_by=colour",
    ] {
        let answer = app.get(&format!("/v1/usage?{refused}"), token).await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
        assert_eq!(answer.body["error"]["code"], "invalid_request");
    }

    // Refused whole: a wrong token, a sequence of 0, an unknown kind, an unpriced subject.
    let before = app.count("SELECT count(*) FROM usage_samples").await;
    let good = sample(sandbox, 11, false);
    let (status, _) = report(
        &app,
        "wrong-token",
        &UsageReport {
            worker: worker.clone(),
            samples: vec![good],
            events: Vec::new(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = report_as_worker(
        &app,
        &UsageReport {
            worker: worker.clone(),
            samples: vec![good, sample(sandbox, 0, false)],
            events: Vec::new(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");
    let (status, body) = report_as_worker(
        &app,
        &UsageReport {
            worker: worker.clone(),
            samples: vec![good],
            events: vec![event(sandbox, "x", "gpu_seconds", "", 1)],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, body) = report_as_worker(
        &app,
        &UsageReport {
            worker: worker.clone(),
            samples: vec![good],
            events: vec![event(sandbox, "y", "api_calls", "unpriced", 1)],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "unknown_price");
    assert_eq!(
        app.count("SELECT count(*) FROM usage_samples").await,
        before
    );
    // Another worker cannot report for this sandbox.
    let (status, receipt) = report_as_worker(
        &app,
        &UsageReport {
            worker: "someone-else".to_owned(),
            samples: vec![good],
            events: Vec::new(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        (status, receipt["samples"].as_u64()),
        (StatusCode::OK, Some(0))
    );
    assert_ledger_consistent(&app).await;
}

/// A real worker samples a busy sandbox (wall and cgroup CPU time), then dies without a
/// word: the sandbox is billed up to the last sample that reached the gateway, once.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_worker_s_sandbox_is_billed_up_to_its_last_sample_once() {
    let app = usage_app().await;
    let config = worker_config(&app, "w", 4, 0);
    let mut worker = TestWorker::start(config.clone()).await;
    let alice = app.signup(&crate::helpers::email("alice"), "Alice").await;
    let token = alice.api_key.token.as_str();
    let id = create_ok(&app, token, json!({})).await;
    let sandbox: Uuid = id.parse().unwrap();
    // Burn CPU in the background.
    sh(
        &app,
        token,
        &id,
        "(while :; do :; done) >/dev/null 2>&1 & echo started",
    )
    .await;
    wait_until("samples with CPU time", Duration::from_secs(20), || async {
        app.count(&format!(
            "SELECT count(*) FROM sandboxes WHERE id = '{sandbox}' \
                 AND metered_cpu_usec > 500000 AND metered_ms > 2000"
        ))
        .await
            == 1
    })
    .await;
    worker.running.take().unwrap().abandon();
    wait_until(
        "the sandbox to be lost",
        Duration::from_secs(20),
        || async {
            app.get(&format!("/v1/sandboxes/{id}"), token).await.body["stop_reason"] == "lost"
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_until("every sample charged", Duration::from_secs(10), || async {
        app.count("SELECT count(*) FROM usage_samples WHERE NOT processed")
            .await
            == 0
    })
    .await;
    let (max_uptime, max_cpu): (i64, i64) = sqlx::query_as(
        "SELECT max(uptime_ms), max(cpu_usec) FROM usage_samples WHERE sandbox_id = $1",
    )
    .bind(sandbox)
    .fetch_one(&app.db)
    .await
    .unwrap();
    let (metered_ms, metered_cpu, spent, last): (i64, i64, i64, bool) = sqlx::query_as(
        "SELECT metered_ms, metered_cpu_usec, spent_micro, metered_final FROM sandboxes WHERE id = $1",
    )
    .bind(sandbox)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!((metered_ms, metered_cpu), (max_uptime, max_cpu));
    assert!(!last, "a killed worker sends no last sample");
    // A busy loop measured in the cgroup, held to its 1 vCPU (the machine is shared with
    // other tests, so only the bounds are certain).
    assert!(
        max_cpu > 500_000 && max_cpu <= max_uptime * 1200 + 100_000,
        "{max_cpu} µs of CPU in {max_uptime} ms"
    );
    // 1 vCPU + 128 MB = 15 a second; 5 a CPU-second; rounded up once over the whole.
    let due = (15 * max_uptime as u128).div_ceil(1000) + (5 * max_cpu as u128).div_ceil(1_000_000);
    let due = due as i128;
    assert_eq!(i128::from(spent), due);
    assert_eq!(i128::from(charged_for(&app, sandbox).await), due);
    // A restarted worker removes the leftover; nothing more is charged.
    worker.running = Some(service::start(config).await.unwrap());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(i128::from(charged_for(&app, sandbox).await), due);
    assert_ledger_consistent(&app).await;
    worker.clean_up().await;
}

/// Operators grant credits over HTTP with the node token; a retry with the same
/// idempotency key grants nothing more; a team's own key cannot.
#[tokio::test(flavor = "multi_thread")]
async fn operators_grant_credits_over_http_once_per_key() {
    let app = usage_app().await;
    let alice = app.signup(&crate::helpers::email("alice"), "Alice").await;
    let token = alice.api_key.token.as_str();
    let team = alice.team.id;
    let before = app.get("/v1/billing/balance", token).await.body["available_micro"]
        .as_i64()
        .unwrap();
    let path = format!("/v1/admin/teams/{team}/grants");
    let body = json!({ "credits": "25", "expires_in_days": 30, "idempotency_key": "invoice-7" });
    app.post(&path, token, body.clone())
        .await
        .assert_error(401, "invalid_operator_token");
    // A worker's node token does not grant credits.
    app.post(&path, NODE_TOKEN, body.clone())
        .await
        .assert_error(401, "invalid_operator_token");
    let granted = app.post(&path, OPERATOR_TOKEN, body.clone()).await;
    assert_eq!(granted.status, StatusCode::CREATED, "{}", granted.body);
    assert_eq!(granted.body["granted"], true);
    let again = app.post(&path, OPERATOR_TOKEN, body).await;
    assert_eq!(again.body["granted"], false);
    let after = app.get("/v1/billing/balance", token).await.body["available_micro"]
        .as_i64()
        .unwrap();
    assert_eq!(after - before, 25_000_000);
    app.post(
        &format!("/v1/admin/teams/{}/grants", Uuid::new_v4()),
        OPERATOR_TOKEN,
        json!({ "credits": "1" }),
    )
    .await
    .assert_error(404, "not_found");
    app.post(&path, OPERATOR_TOKEN, json!({ "credits": "0" }))
        .await
        .assert_error(422, "invalid_request");
    assert_eq!(
        app.count("SELECT count(*) FROM audit_events WHERE action = 'billing.admin_grant'")
            .await,
        1
    );
    assert_ledger_consistent(&app).await;
}
