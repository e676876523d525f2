//! Hostile commands through the public API, under both isolation levels: each fails, and
//! the sandbox, its neighbour and the node keep working.

use reqwest::{Method, StatusCode};
use sandbase_api::sandboxes::Isolation;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::testbed::{
    ISOLATIONS, TestSandbox, TestWorker, create_ok, exec, raw, sandbox_app_isolated, sh,
    worker_config,
};

/// Hostile commands through the API: each fails, and the sandbox and its neighbour keep
/// working, under both isolation levels.
#[tokio::test(flavor = "multi_thread")]
async fn attacks_from_inside_a_sandbox_fail_and_the_node_keeps_working() {
    // Logs captured from here on, for the worker's side of a failed call.
    crate::helpers::captured_logs();
    for isolation in ISOLATIONS {
        attacks_fail_under(isolation).await;
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
async fn attacks_fail_under(isolation: Isolation) {
    let app = sandbox_app_isolated(isolation).await;
    let worker = TestWorker::start(worker_config(&app, "w", 4, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    let sandbox = TestSandbox::create(&app, token, json!({})).await;
    let id = sandbox.id.clone();
    let neighbour = create_ok(&app, token, json!({})).await;
    sh(&app, token, &neighbour, "echo mine > /work/mine").await;

    // Host files: a marker on the host is not visible; a link to /etc/shadow downloads the
    // sandbox's own file (busybox has none), never the host's.
    let marker = format!("/tmp/sandbase-host-marker-{}", Uuid::new_v4().simple());
    std::fs::write(&marker, "host secret").unwrap();
    let result = sandbox.sh(&format!("cat {marker}")).await;
    assert_ne!(result["exit_code"], 0);
    let host_shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    sandbox
        .sh("ln -s /etc/shadow /work/x; ln -s / /work/root")
        .await;
    let (status, body, _) = sandbox.get_file("/work/x").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(host_shadow.is_empty() || !String::from_utf8_lossy(&body).contains("root:"));
    let (_, body, _) = raw(
        &app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/files?path=/work/root/{}", &marker[1..]),
        token,
        None,
    )
    .await;
    assert!(!String::from_utf8_lossy(&body).contains("host secret"));
    std::fs::remove_file(&marker).unwrap();

    // Host services over the network: the sandbox has loopback only.
    let result = sh(
        &app,
        token,
        &id,
        "nc -z -w 2 127.0.0.1 5432 && echo reached; ip addr 2>/dev/null | grep -c 'inet ' ; true",
    )
    .await;
    assert!(
        !result["stdout"].as_str().unwrap().contains("reached"),
        "{}",
        result["stdout"]
    );
    // Mount, new namespaces, tracing and signalling the agent, as the user and as the
    // sandbox's root.
    // (Debian's runsc shows the agent's /proc entries to every user of the sandbox: there
    // the environment is read below and must hold nothing but the agent's PATH and HOME.)
    let environ = ("cat /proc/1/environ", "user");
    for (command, user) in [
        ("mount -t tmpfs none /mnt", "root"),
        ("unshare -r true", "user"),
        ("unshare -m true", "root"),
        ("kill -9 1", "user"),
        environ,
        ("ls /.sandbase/run", "user"),
        ("echo x > /bin/x", "root"),
    ] {
        if isolation == Isolation::Gvisor && (command, user) == environ {
            let answer = exec(&app, token, &id, json!({ "command": "tr '\\0' '\\n' < /proc/1/environ | cut -d= -f1 | sort", "user": "user" })).await;
            assert_eq!(answer.body["stdout"], "HOME\nPATH\n", "{}", answer.body);
            continue;
        }
        let answer = exec(
            &app,
            token,
            &id,
            json!({ "command": command, "user": user }),
        )
        .await;
        assert_ne!(
            answer.body["exit_code"], 0,
            "`{command}` as {user} succeeded: {}",
            answer.body
        );
    }
    // Resource exhaustion: a fork bomb, a memory hog, filling the disk.
    let bomb = exec(
        &app,
        token,
        &id,
        json!({ "command": "b() { b | b & }; b; sleep 2", "timeout_secs": 5 }),
    )
    .await;
    if bomb.status != StatusCode::OK {
        // Under gVisor the bomb has now and then ended the sandbox during its own exec (see
        // below and docs/security.md); under runc the exec always answers.
        assert_eq!(
            (isolation, bomb.status),
            (Isolation::Gvisor, StatusCode::BAD_GATEWAY),
            "{}",
            bomb.body
        );
        eprintln!(
            "under gVisor the fork bomb ended the sandbox during its exec: {}",
            bomb.body
        );
    }
    exec(
        &app,
        token,
        &id,
        // Repeated: a bomb process in the middle of a fork when the first signal went out
        // leaves a child that missed it.
        json!({ "command": "for i in 1 2 3 4 5; do kill -9 -1; sleep 0.2; done", "user": "user" }),
    )
    .await;
    // The sandbox answers again (within three tries). Under gVisor the bomb has now and
    // then ended the sandbox itself (its agent gone, no OOM kill in the host's log; the cause
    // is not found yet): there the node and the neighbour must keep working.
    if let Err(failure) = answers_within_three_tries(&app, token, &id, "true", "").await {
        assert_eq!(isolation, Isolation::Gvisor, "{failure}");
        eprintln!("under gVisor the fork bomb ended the sandbox: {failure}");
        let result = sh(&app, token, &neighbour, "cat /work/mine").await;
        assert_eq!(result["stdout"], "mine\n");
        worker.clean_up().await;
        return;
    }
    // A bomb child caught mid-fork by every kill may still hold the pids limit for a moment
    // (seen once under a loaded machine: the fill's shell could not start, EAGAIN): killed
    // again, and the fill tried again, at most three times.
    let mut fill = Value::Null;
    for _ in 0..3 {
        fill = sh(
            &app,
            token,
            &id,
            "dd if=/dev/zero of=/work/fill bs=1M count=200",
        )
        .await;
        let starved = fill["stderr"]
            .as_str()
            .is_some_and(|stderr| stderr.contains("Resource temporarily unavailable"));
        if !starved {
            break;
        }
        exec(
            &app,
            token,
            &id,
            json!({ "command": "kill -9 -1; sleep 1", "user": "user" }),
        )
        .await;
    }
    assert!(
        fill["stderr"].as_str().unwrap().contains("No space left"),
        "{}",
        fill
    );

    // Both sandboxes still answer, and the neighbour kept its files. Under gVisor the bomb's
    // aftermath has also ended the sandbox a little later, during the fill (the same open
    // case as above): there too only the node and the neighbour must keep working.
    let alive =
        answers_within_three_tries(&app, token, &id, "rm -f /work/fill; echo alive", "alive\n");
    if let Err(failure) = alive.await {
        assert_eq!(isolation, Isolation::Gvisor, "{failure}");
        eprintln!("under gVisor the sandbox ended after the bomb and the fill: {failure}");
        let result = sh(&app, token, &neighbour, "cat /work/mine").await;
        assert_eq!(result["stdout"], "mine\n");
        worker.clean_up().await;
        return;
    }
    let result = sh(&app, token, &neighbour, "cat /work/mine").await;
    assert_eq!(result["stdout"], "mine\n");
    // A memory hog: under runc the OOM killer takes the hog and the sandbox answers on;
    // under gVisor the Sentry holds the sandbox's memory, so the sandbox ends with it.
    let hog = exec(
        &app,
        token,
        &id,
        json!({ "command": "awk 'BEGIN { s = \"x\"; for (i = 0; i < 40; i++) s = s s; print length(s) }'" }),
    )
    .await;
    match isolation {
        Isolation::Runc => {
            assert_ne!(hog.body["exit_code"], 0, "{}", hog.body);
            let result = sh(&app, token, &id, "echo alive").await;
            assert_eq!(result["stdout"], "alive\n");
        }
        Isolation::Gvisor => assert!(
            hog.status != StatusCode::OK || hog.body["exit_code"] != 0,
            "{}",
            hog.body
        ),
    }
    // The neighbour is untouched either way.
    let result = sh(&app, token, &neighbour, "cat /work/mine").await;
    assert_eq!(result["stdout"], "mine\n");
    worker.clean_up().await;
}

/// Runs `command` until it answers `stdout` (three tries, a second apart); what went wrong
/// (with the worker's logged causes) when it never did.
async fn answers_within_three_tries(
    app: &crate::helpers::TestApp,
    token: &str,
    id: &str,
    command: &str,
    stdout: &str,
) -> Result<(), String> {
    let mut tries = Vec::new();
    for _ in 0..3 {
        let answer = exec(app, token, id, json!({ "command": command })).await;
        if answer.status == StatusCode::OK && answer.body["stdout"] == stdout {
            return Ok(());
        }
        if answer.status != StatusCode::OK {
            let logs = crate::helpers::captured_logs();
            let cause = logs
                .lines()
                .rev()
                .find(|line| line.contains("internal API call failed"));
            eprintln!("`{command}` failed: {} (worker: {cause:?})", answer.body);
        }
        tries.push(answer.body);
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let logs = crate::helpers::captured_logs();
    let failures: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("internal API call failed"))
        .collect();
    Err(format!(
        "the sandbox no longer answers `{command}`: {tries:?}; the worker said: {failures:?}"
    ))
}
