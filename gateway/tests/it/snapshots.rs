//! Snapshots and forks: a sandbox's /work and /tmp (contents, modes, owners, links) come
//! back byte-identical in new sandboxes, forks diverge independently, another team can
//! neither take nor use them, and they are metered while kept and deleted with their
//! archives; under both isolation levels.

use std::time::Duration;

use sandbase_api::sandboxes::Isolation;
use serde_json::json;

use crate::testbed::{
    ISOLATIONS, TestSandbox, TestWorker, create, sandbox_app_isolated, wait_until, worker_config,
};

/// Files of every kind, with their modes and owners: a script, a private file, a
/// directory only its owner enters, a root-owned file, a link, 1 MiB of random bytes, a
/// file in /tmp.
const SEED: &str = "set -e; mkdir -p /work/app/private; \
    printf '#!/bin/sh\\necho hi\\n' > /work/app/run.sh; chmod 754 /work/app/run.sh; \
    echo secret > /work/app/private/key; chmod 600 /work/app/private/key; chmod 700 /work/app/private; \
    ln -s run.sh /work/app/link; \
    head -c 1048576 /dev/urandom > /work/blob; \
    echo scratch > /tmp/scratch";

/// Every entry under /work and /tmp with its type, mode, owner, size and (files) checksum.
const LISTING: &str = "cd / && find work tmp -mindepth 1 | sort | while read -r p; do \
    printf '%s %s %s %s' \"$p\" \"$(stat -c '%F %a %u:%g %s' \"$p\")\"; \
    if [ -f \"$p\" ] && [ ! -L \"$p\" ]; then printf ' %s' \"$(md5sum < \"$p\")\"; fi; \
    if [ -L \"$p\" ]; then printf ' -> %s' \"$(readlink \"$p\")\"; fi; echo; done";

async fn listing(sandbox: &TestSandbox<'_>) -> String {
    let listed = sandbox
        .exec(json!({ "command": LISTING, "user": "root" }))
        .await;
    assert_eq!(listed.body["exit_code"], 0, "{}", listed.body);
    listed.body["stdout"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_restores_byte_identical_and_forks_diverge() {
    for isolation in ISOLATIONS {
        snapshots_under(isolation).await;
    }
}

#[allow(clippy::too_many_lines)] // one scenario: seed, snapshot, three forks, refusals, expiry
async fn snapshots_under(isolation: Isolation) {
    let app = sandbox_app_isolated(isolation).await;
    let worker = TestWorker::start(worker_config(&app, "snap", 6, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let bob = app.signup("bob@example.com", "Bob").await;
    let token = alice.api_key.token.as_str();
    let origin = TestSandbox::create(&app, token, json!({})).await;
    let seeded = origin.sh(SEED).await;
    assert_eq!(seeded["exit_code"], 0, "{seeded}");
    let owned = origin
        .exec(json!({ "command": "echo root > /work/app/by-root", "user": "root" }))
        .await;
    assert_eq!(owned.body["exit_code"], 0, "{}", owned.body);
    let expected = listing(&origin).await;
    assert!(
        expected.contains("work/app/by-root regular file 644 0:0"),
        "{expected}"
    );
    assert!(
        expected.contains("work/app/private directory 700 1000:1000"),
        "{expected}"
    );

    // Another team can neither snapshot it nor see a snapshot of it.
    let foreign = app
        .post(&origin.path("/snapshots"), &bob.api_key.token, json!({}))
        .await;
    assert_eq!(foreign.status.as_u16(), 404, "{}", foreign.body);
    let taken = origin.post("/snapshots", json!({})).await;
    assert_eq!(taken.status.as_u16(), 201, "{}", taken.body);
    let snapshot = taken.body["id"].as_str().unwrap().to_owned();
    assert!(
        taken.body["size_bytes"].as_i64().unwrap() > 1_048_576,
        "{}",
        taken.body
    );
    assert_eq!(taken.body["template"], "busybox");
    let stolen = create(&app, &bob.api_key.token, json!({ "snapshot": snapshot })).await;
    assert_eq!(stolen.status.as_u16(), 404, "{}", stolen.body);
    let hidden = app
        .get(&format!("/v1/snapshots/{snapshot}"), &bob.api_key.token)
        .await;
    assert_eq!(hidden.status.as_u16(), 404);
    let wrong = create(
        &app,
        token,
        json!({ "snapshot": snapshot, "template": "base" }),
    )
    .await;
    assert_eq!(wrong.status.as_u16(), 422, "{}", wrong.body);

    // The original goes; three forks come back identical to it.
    assert_eq!(origin.delete("").await.status.as_u16(), 204);
    let mut forks = Vec::new();
    for _ in 0..3 {
        forks.push(TestSandbox::create(&app, token, json!({ "snapshot": snapshot })).await);
    }
    for fork in &forks {
        assert_eq!(listing(fork).await, expected);
        assert_eq!(fork.sh("/work/app/link").await["stdout"], "hi\n");
    }
    // ... and diverge: each one's writes are its own.
    for (index, fork) in forks.iter().enumerate() {
        let wrote = fork
            .sh(&format!("echo {index} > /work/mine; rm /work/blob"))
            .await;
        assert_eq!(wrote["exit_code"], 0, "{wrote}");
    }
    for (index, fork) in forks.iter().enumerate() {
        let read = fork.sh("cat /work/mine; ls /work").await;
        assert_eq!(read["stdout"], format!("{index}\napp\nmine\n"), "{read}");
    }
    // A fork of a fork starts from the fork's own state.
    let second = forks[1].post("/snapshots", json!({})).await;
    assert_eq!(second.status.as_u16(), 201, "{}", second.body);
    let grandchild =
        TestSandbox::create(&app, token, json!({ "snapshot": second.body["id"] })).await;
    assert_eq!(grandchild.sh("cat /work/mine").await["stdout"], "1\n");

    // Listed, metered as storage, deleted with its archives.
    let listed = app.get("/v1/snapshots", token).await;
    assert_eq!(
        listed.body["snapshots"].as_array().unwrap().len(),
        2,
        "{}",
        listed.body
    );
    wait_until(
        "snapshot storage metered",
        Duration::from_secs(20),
        || async {
            app.count(&format!(
            "SELECT count(*) FROM usage_events WHERE event_key LIKE 'storage-snapshot:{snapshot}:%'"
        ))
        .await
            > 0
        },
    )
    .await;
    let artifacts = app.settings.runs.artifacts_dir.join("snapshots");
    let deleted = app
        .delete(&format!("/v1/snapshots/{snapshot}"), token)
        .await;
    assert_eq!(deleted.status.as_u16(), 204);
    assert!(
        !artifacts
            .join(alice.team.id.to_string())
            .join(&snapshot)
            .join("work.tar")
            .exists(),
        "the archive is left"
    );
    let gone = create(&app, token, json!({ "snapshot": snapshot })).await;
    assert_eq!(gone.status.as_u16(), 404, "{}", gone.body);
    // Past its retention a snapshot is deleted by the gateway's job.
    app.count(&format!(
        "WITH e AS (UPDATE snapshots SET expires_at = now() WHERE id = '{}' RETURNING 1) \
         SELECT count(*) FROM e",
        second.body["id"].as_str().unwrap()
    ))
    .await;
    wait_until(
        "the expired snapshot deleted",
        Duration::from_secs(30),
        || async { app.count("SELECT count(*) FROM snapshots").await == 0 },
    )
    .await;
    for fork in forks.iter().chain([&grandchild]) {
        assert_eq!(fork.delete("").await.status.as_u16(), 204);
    }
    worker.clean_up().await;
}
