//! Pause and resume: a paused sandbox's processes stop and go on where they were (the same
//! pid, the same shell session), calls are refused meanwhile, the paused time is reported
//! and charged apart, and a sandbox that pauses itself when idle is resumed by the next
//! call; under both isolation levels.

use std::time::Duration;

use sandbase_api::sandboxes::Isolation;
use serde_json::json;

use crate::testbed::{
    ISOLATIONS, TestSandbox, TestWorker, all_metered, sandbox_app_isolated, wait_until,
    worker_config,
};

/// A loop that counts 20 times a second into /work/count (renamed into place, so a reader
/// never finds it truncated and not yet written).
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /work/count.new; mv /work/count.new /work/count; sleep 0.05; done";

async fn count(sandbox: &TestSandbox<'_>) -> u64 {
    let read = sandbox.sh("cat /work/count").await;
    read["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a count: {read}"))
}

async fn state_of(sandbox: &TestSandbox<'_>) -> String {
    let answer = sandbox.get("").await;
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.body);
    answer.body["state"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_keeps_its_processes_frozen_until_it_is_resumed() {
    for isolation in ISOLATIONS {
        pause_under(isolation).await;
    }
}

#[allow(clippy::too_many_lines)] // one scenario: pause, refusals, resume, billing, destroy
async fn pause_under(isolation: Isolation) {
    let app = sandbox_app_isolated(isolation).await;
    let worker = TestWorker::start(worker_config(&app, "p", 4, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let bob = app.signup("bob@example.com", "Bob").await;
    let sandbox = TestSandbox::create(&app, &alice.api_key.token, json!({})).await;
    let started = sandbox
        .exec(json!({ "command": COUNTER, "background": true }))
        .await;
    assert_eq!(started.status.as_u16(), 201, "{}", started.body);
    let pid = started.body["pid"].clone();
    let session = sandbox
        .exec(json!({ "command": "export KEPT=yes; cd /tmp", "session": "s" }))
        .await;
    assert_eq!(session.body["exit_code"], 0, "{}", session.body);
    wait_until("the counter to count", Duration::from_secs(10), || async {
        sandbox.sh("cat /work/count").await["exit_code"] == 0
    })
    .await;

    // Another team's key cannot pause it.
    let foreign = app
        .post(&sandbox.path("/pause"), &bob.api_key.token, json!({}))
        .await;
    assert_eq!(foreign.status.as_u16(), 404, "{}", foreign.body);

    let before = count(&sandbox).await;
    let paused = sandbox.post("/pause", json!({})).await;
    assert_eq!(paused.status.as_u16(), 200, "{}", paused.body);
    assert_eq!(paused.body["state"], "paused", "{}", paused.body);
    assert_eq!(state_of(&sandbox).await, "paused");
    // Pausing again changes nothing.
    let again = sandbox.post("/pause", json!({})).await;
    assert_eq!(again.status.as_u16(), 200, "{}", again.body);

    // Calls that reach the sandbox are refused, with a code saying why.
    let refused = sandbox.exec(json!({ "command": "true" })).await;
    assert_eq!(refused.status.as_u16(), 409, "{}", refused.body);
    assert_eq!(refused.body["error"]["code"], "sandbox_paused");
    let (status, body, _) = sandbox.get_file("/work/count").await;
    assert_eq!(status.as_u16(), 409, "{}", String::from_utf8_lossy(&body));
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let resumed = sandbox.post("/resume", json!({})).await;
    assert_eq!(resumed.status.as_u16(), 200, "{}", resumed.body);
    assert_eq!(resumed.body["state"], "running", "{}", resumed.body);
    // 1.5 s paused: a running counter would have moved ~30.
    let after = count(&sandbox).await;
    assert!(
        after - before <= 8,
        "the counter ran while paused: {before} → {after}"
    );
    // The same process goes on counting.
    wait_until("the counter to go on", Duration::from_secs(10), || async {
        count(&sandbox).await > after + 5
    })
    .await;
    let process = sandbox.get(&format!("/processes/{pid}")).await;
    assert_eq!(process.body["running"], true, "{}", process.body);
    // The shell session kept its directory and environment.
    let kept = sandbox
        .exec(json!({ "command": "pwd; echo $KEPT", "session": "s" }))
        .await;
    assert_eq!(kept.body["stdout"], "/tmp\nyes\n", "{}", kept.body);
    // Resuming a running sandbox changes nothing.
    let again = sandbox.post("/resume", json!({})).await;
    assert_eq!(again.status.as_u16(), 200, "{}", again.body);

    // A paused sandbox can be destroyed, and nothing of it is left.
    let paused = sandbox.post("/pause", json!({})).await;
    assert_eq!(paused.status.as_u16(), 200, "{}", paused.body);
    assert_eq!(sandbox.delete("").await.status.as_u16(), 204);
    assert!(worker.containers().await.is_empty(), "a container is left");
    let stopped = sandbox.post("/resume", json!({})).await;
    assert_eq!(stopped.status.as_u16(), 409, "{}", stopped.body);
    assert_eq!(stopped.body["error"]["code"], "sandbox_not_running");

    // Its paused time was reported and charged apart.
    wait_until("the last sample charged", Duration::from_secs(20), || {
        all_metered(&app)
    })
    .await;
    let paused_ms: i64 = app
        .count(&format!(
            "SELECT sampled_paused_ms FROM sandboxes WHERE id = '{}'",
            sandbox.id
        ))
        .await;
    assert!(paused_ms >= 1500, "paused for {paused_ms} ms");
    let charged_paused: i64 = app
        .count(&format!(
            "SELECT coalesce(sum((details->>'paused_milliseconds')::bigint), 0)::bigint \
             FROM ledger_transactions WHERE details->>'sandbox' = '{}'",
            sandbox.id
        ))
        .await;
    assert_eq!(charged_paused, paused_ms);
    worker.clean_up().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_sandbox_pauses_itself_and_the_next_call_resumes_it() {
    let app = sandbox_app_isolated(Isolation::Runc).await;
    let worker = TestWorker::start(worker_config(&app, "p", 4, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let sandbox = TestSandbox::create(
        &app,
        &alice.api_key.token,
        json!({ "auto_pause_after_idle_secs": 1 }),
    )
    .await;
    assert_eq!(sandbox.get("").await.body["auto_pause_after_idle_secs"], 1);
    // A command longer than the idle time is not frozen under it.
    let long = sandbox.sh("sleep 2.5; echo done").await;
    assert_eq!(long["stdout"], "done\n", "{long}");
    let started = sandbox
        .exec(json!({ "command": COUNTER, "background": true }))
        .await;
    assert_eq!(started.status.as_u16(), 201, "{}", started.body);

    wait_until(
        "the idle sandbox to pause",
        Duration::from_secs(10),
        || async { state_of(&sandbox).await == "paused" },
    )
    .await;
    // The next call resumes it and is answered.
    let before = count(&sandbox).await;
    wait_until("the counter to go on", Duration::from_secs(10), || async {
        count(&sandbox).await > before + 3
    })
    .await;
    wait_until("the state to follow", Duration::from_secs(10), || async {
        state_of(&sandbox).await == "running"
    })
    .await;
    // The gateway's pause holds against calls even when it paused itself before.
    wait_until(
        "the idle sandbox to pause",
        Duration::from_secs(10),
        || async { state_of(&sandbox).await == "paused" },
    )
    .await;
    assert_eq!(sandbox.post("/pause", json!({})).await.status.as_u16(), 200);
    let refused = sandbox.exec(json!({ "command": "true" })).await;
    assert_eq!(refused.body["error"]["code"], "sandbox_paused");
    assert_eq!(
        sandbox.post("/resume", json!({})).await.status.as_u16(),
        200
    );
    assert_eq!(sandbox.sh("echo back").await["stdout"], "back\n");
    assert_eq!(sandbox.delete("").await.status.as_u16(), 204);
    worker.clean_up().await;
}
