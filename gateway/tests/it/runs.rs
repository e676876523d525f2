//! Runs end to end: inputs in, command, artifacts out; queueing when full, fair between teams.

use std::process::Command;
use std::time::Duration;

use base64::Engine;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::TestApp;
use crate::testbed::{TestWorker, create_ok, raw, sandbox_app, wait_until, worker_config};

async fn finished(app: &TestApp, token: &str, id: &str) -> Value {
    let path = format!("/v1/runs/{id}");
    wait_until("the run to finish", Duration::from_secs(60), || async {
        let run = app.get(&path, token).await.body;
        matches!(run["state"].as_str(), Some("completed" | "failed"))
    })
    .await;
    app.get(&format!("/v1/runs/{id}"), token).await.body
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test(flavor = "multi_thread")]
async fn a_run_takes_inputs_runs_and_keeps_its_outputs() {
    let app = sandbox_app().await;
    let worker = TestWorker::start(worker_config(&app, "w", 4, 1)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let mallory = app.signup("mallory@example.com", "Mallory").await;
    let token = alice.api_key.token.as_str();

    // An archive input plus a named file.
    let scratch = std::env::temp_dir().join(format!("sandbase-run-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(scratch.join("data")).unwrap();
    std::fs::write(scratch.join("data/numbers.txt"), "1\n2\n3\n").unwrap();
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&scratch)
        .args(["-cf", "-", "data"])
        .output()
        .unwrap();
    let body = json!({
        "command": "cat /work/in/data/numbers.txt | wc -l > /work/out/count.txt; cat /work/in/note.txt; \
                    echo tamper > /work/in/note.txt || echo read-only >&2; mkdir -p /work/out/sub; echo deep > /work/out/sub/d.txt; exit 5",
        "inputs": {
            "files": { "note.txt": "a note\n" },
            "tar_base64": base64::engine::general_purpose::STANDARD.encode(&tar.stdout),
        },
    });
    let answer = app.post("/v1/runs", token, body).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
    let id = answer.body["id"].as_str().unwrap().to_owned();
    let run = finished(&app, token, &id).await;
    assert_eq!(run["state"], "completed", "{run}");
    assert_eq!(run["exit_code"], 5);
    assert_eq!(run["stdout"], "a note\n");
    assert!(
        run["stderr"].as_str().unwrap().contains("read-only"),
        "{run}"
    );

    let (status, archive, headers) = raw(
        &app,
        Method::GET,
        &format!("/v1/runs/{id}/artifacts"),
        token,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/x-tar");
    assert_eq!(run["artifact_size"], archive.len());
    std::fs::write(scratch.join("out.tar"), &archive).unwrap();
    let out = scratch.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let unpacked = Command::new("tar")
        .arg("-xf")
        .arg(scratch.join("out.tar"))
        .arg("-C")
        .arg(&out)
        .status()
        .unwrap();
    assert!(unpacked.success());
    assert_eq!(
        std::fs::read_to_string(out.join("count.txt"))
            .unwrap()
            .trim(),
        "3"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("sub/d.txt")).unwrap(),
        "deep\n"
    );

    // The run's sandbox is gone.
    let sandbox: Option<(String,)> = sqlx::query_as(
        "SELECT s.stop_reason FROM runs r JOIN sandboxes s ON s.id = r.sandbox_id WHERE r.id = $1",
    )
    .bind(Uuid::parse_str(&id).unwrap())
    .fetch_optional(&app.db)
    .await
    .unwrap();
    assert_eq!(
        sandbox.map(|(reason,)| reason).as_deref(),
        Some("destroyed")
    );
    wait_until(
        "the run's sandbox removal",
        Duration::from_secs(10),
        || async { worker.running().node().ids().is_empty() },
    )
    .await;

    // Another team sees none of it.
    let evil = mallory.api_key.token.as_str();
    app.get(&format!("/v1/runs/{id}"), evil)
        .await
        .assert_error(404, "not_found");
    app.get(&format!("/v1/runs/{id}/artifacts"), evil)
        .await
        .assert_error(404, "not_found");
    assert_eq!(app.get("/v1/runs", evil).await.body["runs"], json!([]));
    // Bad input.
    for body in [
        json!({ "cmd": [] }),
        json!({ "command": "true", "inputs": { "files": { "../escape": "x" } } }),
        json!({ "command": "true", "inputs": { "tar_base64": "not base64!" } }),
        json!({ "command": "true", "outputs": "/work/in/x" }),
        json!({ "command": "true", "timeout_secs": 0 }),
    ] {
        let answer = app.post("/v1/runs", token, body.clone()).await;
        assert_eq!(answer.status.as_u16(), 422, "{body}: {}", answer.body);
    }
    // A run without outputs has no artifact.
    let answer = app
        .post(
            "/v1/runs",
            token,
            json!({ "command": "rmdir /work/out; echo bye" }),
        )
        .await;
    let quiet = answer.body["id"].as_str().unwrap().to_owned();
    let run = finished(&app, token, &quiet).await;
    assert_eq!(run["stdout"], "bye\n", "{run}");
    app.get(&format!("/v1/runs/{quiet}/artifacts"), token)
        .await
        .assert_error(404, "no_artifact");
    // An outputs directory whose name holds what a query string would split on: the
    // worker is asked for exactly that directory (the parameter is encoded, not pasted).
    let odd = "/work/out dir&path=/etc#x?y=1";
    let answer = app
        .post(
            "/v1/runs",
            token,
            json!({ "command": format!("echo odd > '{odd}/file.txt'"), "outputs": odd }),
        )
        .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
    let odd_run = answer.body["id"].as_str().unwrap().to_owned();
    let run = finished(&app, token, &odd_run).await;
    assert_eq!(
        (run["state"].as_str(), run["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{run}"
    );
    let (status, archive, _) = raw(
        &app,
        Method::GET,
        &format!("/v1/runs/{odd_run}/artifacts"),
        token,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let listing = Command::new("tar")
        .args(["-tf", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut tar| {
            use std::io::Write;
            tar.stdin.take().unwrap().write_all(&archive)?;
            tar.wait_with_output()
        })
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(
        listing.lines().any(|entry| entry.ends_with("file.txt")),
        "{listing}"
    );
    assert!(
        !listing.contains("passwd"),
        "the archive is of /etc: {listing}"
    );
    std::fs::remove_dir_all(&scratch).unwrap();
    worker.clean_up().await;
}

/// With the only worker full, runs wait in the queue; when room appears they run, round
/// robin between teams (one team's backlog does not starve another's run).
#[tokio::test(flavor = "multi_thread")]
async fn runs_wait_for_room_and_teams_take_turns() {
    let app = sandbox_app().await;
    let worker = TestWorker::start(worker_config(&app, "w", 1, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let bob = app.signup("bob@example.com", "Bob").await;
    let (a, b) = (alice.api_key.token.as_str(), bob.api_key.token.as_str());
    // Fill the worker.
    let blocker = create_ok(&app, a, json!({})).await;
    tokio::time::sleep(Duration::from_millis(800)).await;

    let mut alice_runs = Vec::new();
    for i in 0..3 {
        let answer = app
            .post(
                "/v1/runs",
                a,
                json!({ "command": format!("echo alice {i}") }),
            )
            .await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
        alice_runs.push(answer.body["id"].as_str().unwrap().to_owned());
    }
    let answer = app
        .post("/v1/runs", b, json!({ "command": "echo bob" }))
        .await;
    let bob_run = answer.body["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in alice_runs.iter().chain([&bob_run]) {
        let token = if id == &bob_run { b } else { a };
        assert_eq!(
            app.get(&format!("/v1/runs/{id}"), token).await.body["state"],
            "queued"
        );
    }
    // Room: the runs go, one at a time on this one-sandbox worker.
    assert_eq!(
        app.delete(&format!("/v1/sandboxes/{blocker}"), a)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let bob_done = finished(&app, b, &bob_run).await;
    assert_eq!(bob_done["stdout"], "bob\n");
    let mut alice_started = Vec::new();
    for id in &alice_runs {
        let run = finished(&app, a, id).await;
        assert_eq!(run["state"], "completed", "{run}");
        alice_started.push(run["started_at"].as_str().unwrap().to_owned());
    }
    // Bob's run did not wait for all of Alice's.
    let bob_started = bob_done["started_at"].as_str().unwrap().to_owned();
    assert!(
        bob_started < alice_started[2],
        "bob {bob_started}, alice {alice_started:?}"
    );
    worker.clean_up().await;
}

/// With `runs.s3`, inputs and artifacts go to an S3-compatible bucket (moto's server, a
/// local stand-in speaking S3's wire protocol).
#[tokio::test(flavor = "multi_thread")]
async fn artifacts_can_live_in_an_s3_bucket() {
    let moto = std::env::var("SANDBASE_MOTO_SERVER")
        .expect("SANDBASE_MOTO_SERVER: moto's server (scripts/setup --test installs it)");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new(moto)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    wait_until("moto", Duration::from_secs(30), || {
        let (http, url) = (http.clone(), format!("{endpoint}/sandbase"));
        async move {
            http.put(url)
                .send()
                .await
                .is_ok_and(|answer| answer.status().is_success())
        }
    })
    .await;

    let app = crate::helpers::spawn_app_with(|settings| {
        settings.workers.node_token = Some("test-node-token-0123456789".to_owned().into());
        settings.sandboxes.default_template = "busybox".to_owned();
        settings.sandboxes.default_resources.memory_mb = 128;
        settings.sandboxes.default_resources.disk_mb = 64;
        settings.sandboxes.default_resources.pids = 64;
        settings.runs.s3 = Some(sandbase_gateway::config::S3Settings {
            bucket: "sandbase".to_owned(),
            region: "us-east-1".to_owned(),
            endpoint: Some(endpoint.clone()),
            access_key_id: Some("test".to_owned().into()),
            secret_access_key: Some("test".to_owned().into()),
            allow_http: true,
            prefix: "deployment-1".to_owned(),
        });
    })
    .await;
    let worker = TestWorker::start(worker_config(&app, "w", 2, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    let answer = app
        .post(
            "/v1/runs",
            token,
            json!({ "command": "tr a-z A-Z < /work/in/in.txt > /work/out/out.txt", "inputs": { "files": { "in.txt": "to the bucket\n" } } }),
        )
        .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
    let id = answer.body["id"].as_str().unwrap().to_owned();
    let run = finished(&app, token, &id).await;
    assert_eq!(run["state"], "completed", "{run}");
    let (status, archive, _) = raw(
        &app,
        Method::GET,
        &format!("/v1/runs/{id}/artifacts"),
        token,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let mut unpacked = tar::Archive::new(archive.as_slice());
    let mut found = String::new();
    for entry in unpacked.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.path().unwrap().ends_with("out.txt") {
            std::io::Read::read_to_string(&mut entry, &mut found).unwrap();
        }
    }
    assert_eq!(found, "TO THE BUCKET\n");
    // The artifact is in the bucket under the prefix; the inputs are gone once used.
    let listing = http
        .get(format!("{endpoint}/sandbase?list-type=2"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        listing.contains(&format!(
            "deployment-1/artifacts/{}/{id}.tar",
            alice.team.id
        )),
        "{listing}"
    );
    assert!(!listing.contains("deployment-1/inputs/"), "{listing}");
    worker.clean_up().await;
    let _ = server.kill();
    let _ = server.wait();
}

/// Redis is a cache: after every key of the deployment is gone (a flush), queued runs are
/// put back from PostgreSQL, workers re-announce themselves, and balances are reloaded from
/// the ledger — nothing lost, nothing counted twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_flush_loses_nothing() {
    let app = sandbox_app().await;
    let worker = TestWorker::start(worker_config(&app, "w", 1, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    let blocker = create_ok(&app, token, json!({})).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let answer = app
        .post("/v1/runs", token, json!({ "command": "echo survived" }))
        .await;
    let run = answer.body["id"].as_str().unwrap().to_owned();

    // Everything of this deployment in Redis goes.
    let client = redis::Client::open(sandbase_gateway::testing::redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let pattern = format!("{}*", app.settings.redis.key_prefix);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(!keys.is_empty());
    let _: i64 = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut redis)
        .await
        .unwrap();

    // Room again: the queued run is found in PostgreSQL and carried out.
    assert_eq!(
        app.delete(&format!("/v1/sandboxes/{blocker}"), token)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let finished = finished(&app, token, &run).await;
    assert_eq!(
        (finished["state"].as_str(), finished["stdout"].as_str()),
        (Some("completed"), Some("survived\n")),
        "{finished}"
    );
    // Admission reloads the balance from the ledger; charges still land once.
    let id = create_ok(&app, token, json!({})).await;
    assert_eq!(
        app.delete(&format!("/v1/sandboxes/{id}"), token)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    wait_until("the last charges", Duration::from_secs(15), || async {
        app.count(
            "SELECT count(*) FROM sandboxes WHERE stop_reason <> 'failed' AND NOT metered_final",
        )
        .await
            == 0
    })
    .await;
    let duplicates = app
        .count("SELECT count(*) FROM (SELECT idempotency_key FROM ledger_transactions GROUP BY 1 HAVING count(*) > 1) d")
        .await;
    assert_eq!(duplicates, 0);
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

/// A team that cannot pay for a run's first minute cannot fill the queue with runs it will
/// never pay for: refused at enqueue with 402. A run's time is held to the sandboxes'
/// longest lifetime.
#[tokio::test(flavor = "multi_thread")]
async fn runs_are_refused_at_enqueue_without_credits_or_beyond_the_longest_lifetime() {
    let app = crate::helpers::spawn_app_with(|settings| {
        crate::testbed::configure_sandboxes(settings);
        settings.billing.starter_credits = "0".to_owned();
        settings.sandboxes.max_timeout_secs = 600;
    })
    .await;
    let worker = TestWorker::start(worker_config(&app, "w", 2, 0)).await;
    let broke = app.signup(&crate::helpers::email("broke"), "Broke").await;
    let token = broke.api_key.token.as_str();
    // Wait until the worker serves the template (a sandbox create says so by its answer).
    wait_until("the worker", Duration::from_secs(20), || async {
        !matches!(
            app.post("/v1/sandboxes", token, json!({})).await.code(),
            "no_workers" | "template_not_found"
        )
    })
    .await;
    let queued_before = app.count("SELECT count(*) FROM runs").await;
    for _ in 0..3 {
        app.post("/v1/runs", token, json!({ "command": "true" }))
            .await
            .assert_error(402, "insufficient_credits");
    }
    assert_eq!(app.count("SELECT count(*) FROM runs").await, queued_before);
    // With credits, a run longer than the longest sandbox lifetime is refused; a shorter
    // one is queued.
    let granted = app
        .post(
            &format!("/v1/admin/teams/{}/grants", broke.team.id),
            sandbase_gateway::testing::OPERATOR_TOKEN,
            json!({ "credits": "5" }),
        )
        .await;
    assert_eq!(granted.status, StatusCode::CREATED, "{}", granted.body);
    app.post(
        "/v1/runs",
        token,
        json!({ "command": "true", "timeout_secs": 3600 }),
    )
    .await
    .assert_error(422, "invalid_request");
    let queued = app
        .post(
            "/v1/runs",
            token,
            json!({ "command": "true", "timeout_secs": 60 }),
        )
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{}", queued.body);
    let run = finished(&app, token, queued.body["id"].as_str().unwrap()).await;
    assert_eq!(run["state"], "completed", "{run}");
    worker.clean_up().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn artifacts_are_metered_as_storage_then_deleted_when_their_retention_ends() {
    let artifacts_dir =
        std::env::temp_dir().join(format!("sandbase-artifacts-{}", Uuid::new_v4().simple()));
    let app = crate::helpers::spawn_app_with(|settings| {
        crate::testbed::configure_sandboxes(settings);
        settings.runs.artifacts_dir = artifacts_dir.clone();
        settings.runs.artifact_retention_secs = 8;
        settings.runs.storage_meter_secs = 1;
    })
    .await;
    let worker = TestWorker::start(worker_config(&app, "w", 2, 0)).await;
    let owner = app.signup("keeper@example.com", "Keeper").await;
    let token = owner.api_key.token.as_str();
    let body = json!({ "command": "head -c 3000000 /dev/zero > /work/out/blob" });
    let answer = app.post("/v1/runs", token, body).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
    let id = answer.body["id"].as_str().unwrap().to_owned();
    let run = finished(&app, token, &id).await;
    assert_eq!(run["state"], "completed", "{run}");
    let path = format!("/v1/runs/{id}/artifacts");
    let (status, _, _) = raw(&app, Method::GET, &path, token, None).await;
    assert_eq!(status, StatusCode::OK);
    // While kept, the artifact is storage the team pays for (3 MB a second here).
    let storage = |app: &TestApp| {
        let app = app.db.clone();
        async move {
            sqlx::query_scalar::<_, Option<i64>>(
                "SELECT sum(quantity)::bigint FROM usage_events WHERE kind = 'storage_mb_seconds'",
            )
            .fetch_one(&app)
            .await
            .unwrap()
            .unwrap_or(0)
        }
    };
    wait_until("storage usage", Duration::from_secs(15), || async {
        storage(&app).await >= 3
    })
    .await;
    // Once its retention is over it is gone — from the API and from the store.
    wait_until("the artifact's expiry", Duration::from_secs(30), || async {
        raw(&app, Method::GET, &path, token, None).await.0 == StatusCode::GONE
    })
    .await;
    let answer = app.get(&path, token).await;
    answer.assert_error(410, "artifact_expired");
    let stored = walk_files(&artifacts_dir);
    assert!(stored.is_empty(), "left in the store: {stored:?}");
    // And no longer metered.
    let metered = storage(&app).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(storage(&app).await, metered);
    // The storage was charged like any other usage.
    wait_until("the storage charge", Duration::from_secs(30), || async {
        app.count("SELECT count(*) FROM usage_events WHERE kind = 'storage_mb_seconds' AND transaction_id IS NOT NULL")
            .await
            > 0
    })
    .await;
    worker.clean_up().await;
    let _ = std::fs::remove_dir_all(&artifacts_dir);
}

/// Every file under `dir`.
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                found.extend(walk_files(&path));
            } else {
                found.push(path);
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn inputs_of_a_run_stuck_in_the_queue_are_metered_then_expire_with_it() {
    let artifacts_dir =
        std::env::temp_dir().join(format!("sandbase-artifacts-{}", Uuid::new_v4().simple()));
    let app = crate::helpers::spawn_app_with(|settings| {
        crate::testbed::configure_sandboxes(settings);
        settings.runs.artifacts_dir = artifacts_dir.clone();
        settings.runs.artifact_retention_secs = 6;
        settings.runs.storage_meter_secs = 1;
    })
    .await;
    // One worker with room for one sandbox, taken: the run waits in the queue.
    let worker = TestWorker::start(worker_config(&app, "w", 1, 0)).await;
    let owner = app.signup("waiter@example.com", "Waiter").await;
    let token = owner.api_key.token.as_str();
    let sandbox = create_ok(&app, token, json!({})).await;
    let body = json!({
        "command": "true",
        "inputs": { "files": { "big.txt": "x".repeat(2_000_000) } },
    });
    let answer = app.post("/v1/runs", token, body).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
    let id = answer.body["id"].as_str().unwrap().to_owned();
    assert_eq!(walk_files(&artifacts_dir).len(), 1, "the inputs are stored");
    wait_until(
        "the inputs' storage usage",
        Duration::from_secs(15),
        || async {
            app.count("SELECT count(*) FROM usage_events WHERE event_key LIKE 'storage-inputs:%'")
                .await
                > 0
        },
    )
    .await;
    let run = finished(&app, token, &id).await;
    assert_eq!(run["state"], "failed", "{run}");
    assert!(run["error"].as_str().unwrap().contains("queue"), "{run}");
    assert!(
        walk_files(&artifacts_dir).is_empty(),
        "the inputs were left"
    );
    app.delete(&format!("/v1/sandboxes/{sandbox}"), token).await;
    worker.clean_up().await;
    let _ = std::fs::remove_dir_all(&artifacts_dir);
}
