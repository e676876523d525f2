//! Sandboxes end to end: a real gateway, real workers on SandBase's containerd (each test
//! its own containerd namespace, run directory and id range), real PostgreSQL and Redis.

use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use sandbase_worker::service;
use serde_json::{Value, json};
use uuid::Uuid;

use sandbase_api::sandboxes::Isolation;

use crate::testbed::{
    ISOLATIONS, LIMITS, TestSandbox, TestWorker, create, create_ok, exec, raw, sandbox_app,
    sandbox_app_isolated, sh, wait_until, worker_config,
};
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_runs_commands_moves_files_and_is_gone_after_destroy() {
    for isolation in ISOLATIONS {
        runs_commands_moves_files_and_is_gone_under(isolation).await;
    }
}

async fn runs_commands_moves_files_and_is_gone_under(isolation: Isolation) {
    let app = sandbox_app_isolated(isolation).await;
    let worker = TestWorker::start(worker_config(&app, "w", 8, 1)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    let answer = create(
        &app,
        token,
        json!({ "env": { "GREETING": "hello" }, "metadata": { "purpose": "test" } }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(answer.body["template"], "busybox");
    assert_eq!(answer.body["cwd"], "/work");
    assert_eq!(answer.body["isolation"], isolation.as_str());
    let sandbox = TestSandbox {
        app: &app,
        token: token.to_owned(),
        id: answer.body["id"].as_str().unwrap().to_owned(),
    };
    commands_give_output_exit_codes_users_env_stdin_and_time_out(&sandbox).await;
    streams_are_ndjson_with_the_pid_first_and_the_exit_last(&sandbox).await;
    background_processes_take_stdin_and_signals(&sandbox).await;
    files_are_binary_safe_listed_removed_and_capped(&sandbox).await;
    archives_go_in_and_out_and_stay_inside_their_directory(&sandbox).await;
    sandboxes_are_listed_filtered_and_extended(&sandbox).await;
    destroyed_sandboxes_are_gone(&sandbox, &worker).await;
    worker.clean_up().await;
}

/// Commands: output, exit codes, users, env, stdin, not found, timeouts, bad requests.
async fn commands_give_output_exit_codes_users_env_stdin_and_time_out(sandbox: &TestSandbox<'_>) {
    let result = sandbox.sh("echo $GREETING; echo oops >&2; exit 3").await;
    assert_eq!(
        (&result["stdout"], &result["stderr"], &result["exit_code"]),
        (&json!("hello\n"), &json!("oops\n"), &json!(3))
    );
    let cases = [
        (json!({ "cmd": ["id", "-u"] }), "stdout", json!("1000\n")),
        (
            json!({ "cmd": ["id", "-u"], "user": "root" }),
            "stdout",
            json!("0\n"),
        ),
        (
            json!({ "cmd": ["pwd"], "cwd": "/tmp", "env": { "A": "1" } }),
            "stdout",
            json!("/tmp\n"),
        ),
        (
            json!({ "cmd": ["cat"], "stdin": "from stdin" }),
            "stdout",
            json!("from stdin"),
        ),
        (
            json!({ "cmd": ["no-such-program"] }),
            "exit_code",
            json!(127),
        ),
    ];
    for (request, field, expected) in cases {
        let result = sandbox.exec(request.clone()).await;
        assert_eq!(result.body[field], expected, "{request}: {}", result.body);
    }
    let started = Instant::now();
    let result = sandbox
        .exec(json!({ "command": "sleep 30", "timeout_secs": 1 }))
        .await;
    assert_eq!(result.body["timed_out"], true, "{}", result.body);
    assert!(started.elapsed() < Duration::from_secs(10));
    for bad in [
        json!({ "cmd": [] }),
        json!({ "cmd": ["true"], "command": "true" }),
    ] {
        sandbox.exec(bad).await.assert_error(422, "invalid_request");
    }
}

/// Streaming: NDJSON, pid first, exit last.
async fn streams_are_ndjson_with_the_pid_first_and_the_exit_last(sandbox: &TestSandbox<'_>) {
    let app = sandbox.app;
    let response = app
        .http
        .post(format!("{}{}", app.address, sandbox.path("/exec")))
        .bearer_auth(&sandbox.token)
        .json(&json!({ "command": "for i in 1 2 3; do echo line $i; sleep 0.1; done; echo done >&2; exit 4", "stream": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let text = response.text().await.unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(lines[0]["pid"].as_u64().is_some(), "{text}");
    let stdout: String = lines
        .iter()
        .filter_map(|line| line["stdout"].as_str())
        .collect();
    assert_eq!(stdout, "line 1\nline 2\nline 3\n");
    assert!(lines.iter().any(|line| line["stderr"] == "done\n"));
    assert_eq!(lines.last().unwrap()["exit_code"], 4);
}

/// Background processes: stdin, output, signals.
async fn background_processes_take_stdin_and_signals(sandbox: &TestSandbox<'_>) {
    let started = sandbox
        .exec(json!({ "command": "while read line; do echo got $line; done", "background": true }))
        .await;
    assert_eq!(started.status, StatusCode::CREATED, "{}", started.body);
    let pid = started.body["pid"].as_u64().unwrap();
    let listed = sandbox.get("/processes").await;
    assert_eq!(listed.body["processes"][0]["pid"], pid);
    assert_eq!(listed.body["processes"][0]["running"], true);
    let (status, _, _) = sandbox
        .raw(
            Method::POST,
            &format!("/processes/{pid}/stdin"),
            Some(b"one\ntwo\n".to_vec()),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let process = format!("/processes/{pid}");
    wait_until("background output", Duration::from_secs(5), || async {
        sandbox.get(&process).await.body["stdout"] == "got one\ngot two\n"
    })
    .await;
    let signal = format!("/processes/{pid}/signal");
    let signalled = sandbox.post(&signal, json!({ "signal": "TERM" })).await;
    assert_eq!(
        signalled.status,
        StatusCode::NO_CONTENT,
        "{}",
        signalled.body
    );
    wait_until(
        "the signalled process to exit",
        Duration::from_secs(5),
        || async {
            let body = sandbox.get(&process).await.body;
            body["running"] == false && body["exit_code"] == 143
        },
    )
    .await;
    sandbox
        .post(&signal, json!({ "signal": "NOPE" }))
        .await
        .assert_error(422, "invalid_request");
    // A good signal to a process that has exited is refused for its state (the fuzzer found
    // it refused as a bad request).
    sandbox
        .post(&signal, json!({ "signal": "TERM" }))
        .await
        .assert_error(409, "process_exited");
    // Input after the process's standard input was closed is refused for its state (the
    // fuzzer found it refused as a bad request).
    let started = sandbox
        .exec(json!({ "command": "cat > /dev/null; sleep 60", "background": true }))
        .await;
    let pid = started.body["pid"].as_u64().unwrap();
    let stdin = format!("/processes/{pid}/stdin");
    let (status, _, _) = sandbox
        .raw(
            Method::POST,
            &format!("{stdin}?close=true"),
            Some(Vec::new()),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body, _) = sandbox
        .raw(Method::POST, &stdin, Some(b"late\n".to_vec()))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "stdin_closed", "{body}");
    let killed = sandbox
        .post(
            &format!("/processes/{pid}/signal"),
            json!({ "signal": "KILL" }),
        )
        .await;
    assert_eq!(killed.status, StatusCode::NO_CONTENT, "{}", killed.body);
    sandbox
        .get("/processes/999999")
        .await
        .assert_error(404, "process_not_found");
}

/// Files: binary-safe, larger than a frame, directory listings, removal, the disk cap.
async fn files_are_binary_safe_listed_removed_and_capped(sandbox: &TestSandbox<'_>) {
    let content: Vec<u8> = (0..5 * 1024 * 1024 + 17)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let (status, body) = sandbox.put_file("data/blob.bin", content.clone()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let info: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(info["path"], "/work/data/blob.bin");
    assert_eq!(info["size"], content.len());
    let (status, body, headers) = sandbox.get_file("/work/data/blob.bin").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert!(body == content, "the file came back different");
    let result = sandbox.sh("stat -c '%u %s' /work/data/blob.bin").await;
    assert_eq!(result["stdout"], format!("1000 {}\n", content.len()));
    let listing = sandbox.get("/files?path=/work/data").await;
    assert_eq!(
        listing.body["entries"][0]["name"], "blob.bin",
        "{}",
        listing.body
    );
    assert_eq!(listing.body["entries"][0]["kind"], "file");
    sandbox
        .get("/files?path=/nope")
        .await
        .assert_error(404, "path_not_found");
    // The image's own file system is read-only (found by the fuzzer: 500 `sandbox_io_error`):
    // writing there is the sender's mistake, not the sandbox's.
    let (status, body, _) = sandbox
        .raw(
            Method::PUT,
            "/files?path=/%26&recursive=true",
            Some(b"x".to_vec()),
        )
        .await;
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "permission_denied", "{body}");
    sandbox
        .delete("/files?path=/work/data")
        .await
        .assert_error(409, "directory_not_empty");
    let removed = sandbox
        .delete("/files?path=/work/data&recursive=true")
        .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT);
    sandbox
        .get("/files?path=/work/data/blob.bin")
        .await
        .assert_error(404, "path_not_found");
    // A file over the disk cap fails and leaves nothing half-written.
    let too_big = vec![0u8; (LIMITS.disk_mb as usize + 8) * 1024 * 1024];
    let (status, _) = sandbox.put_file("big", too_big).await;
    assert!(
        status.is_server_error() || status.is_client_error(),
        "{status}"
    );
    let result = sandbox.sh("ls -A /work").await;
    assert_eq!(result["stdout"], "", "leftovers: {}", result["stdout"]);
}

/// Archives: a directory in, and out again; a hostile archive writes nothing outside.
async fn archives_go_in_and_out_and_stay_inside_their_directory(sandbox: &TestSandbox<'_>) {
    let scratch =
        std::env::temp_dir().join(format!("sandbase-archive-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(scratch.join("in/sub")).unwrap();
    std::fs::write(scratch.join("in/a.txt"), "alpha").unwrap();
    std::fs::write(scratch.join("in/sub/b.txt"), "beta").unwrap();
    let tar = Command::new("tar")
        .arg("-C")
        .arg(scratch.join("in"))
        .args(["-cf", "-", "."])
        .output()
        .unwrap();
    let project = "/archive?path=/work/project";
    let (status, body, _) = sandbox
        .raw(Method::PUT, project, Some(tar.stdout.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let result = sandbox.sh("cat /work/project/a.txt /work/project/sub/b.txt; echo x > /work/project/sub/c.txt; stat -c %u /work/project/sub").await;
    assert_eq!(result["stdout"], "alphabeta1000\n");
    let (status, body, headers) = sandbox.raw(Method::GET, project, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/x-tar");
    std::fs::write(scratch.join("out.tar"), &body).unwrap();
    let listed = Command::new("tar")
        .arg("-tf")
        .arg(scratch.join("out.tar"))
        .output()
        .unwrap();
    let names = String::from_utf8(listed.stdout).unwrap();
    for expected in ["a.txt", "sub/b.txt", "sub/c.txt"] {
        assert!(
            names
                .lines()
                .any(|name| name.trim_start_matches("./") == expected),
            "{names}"
        );
    }
    std::fs::write(scratch.join("evil.txt"), "evil").unwrap();
    let evil = Command::new("tar")
        .arg("-C")
        .arg(&scratch)
        .args(["-cf", "-", "-P", "--transform", "s|^|../../|", "evil.txt"])
        .output()
        .unwrap();
    let (status, _, _) = sandbox.raw(Method::PUT, project, Some(evil.stdout)).await;
    assert!(status.is_client_error(), "{status}");
    let result = sandbox.sh("ls /evil.txt /work/evil.txt 2>&1; true").await;
    assert!(
        !result["stdout"].as_str().unwrap().contains("evil.txt\n"),
        "{}",
        result["stdout"]
    );
    // What is not a tar archive (found by the fuzzer: 500 `sandbox_io_error`) is refused as
    // the sender's mistake, whole or cut short, and the sandbox goes on.
    let mut cut = tar.stdout.clone();
    cut.truncate(700);
    for garbage in [b"[1979811832, 2766246]".to_vec(), cut, Vec::new()] {
        let (status, body, _) = sandbox.raw(Method::PUT, project, Some(garbage)).await;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    }
    let result = sandbox.sh("cat /work/project/a.txt").await;
    assert_eq!(result["stdout"], "alpha");
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// Listing, filters, timeout extension.
async fn sandboxes_are_listed_filtered_and_extended(sandbox: &TestSandbox<'_>) {
    let (app, token) = (sandbox.app, sandbox.token.as_str());
    let listed = app
        .get("/v1/sandboxes?state=running&metadata.purpose=test", token)
        .await;
    assert_eq!(listed.body["sandboxes"][0]["id"], sandbox.id.as_str());
    let listed = app.get("/v1/sandboxes?metadata.purpose=other", token).await;
    assert_eq!(listed.body["sandboxes"], json!([]));
    app.get("/v1/sandboxes?state=bogus", token)
        .await
        .assert_error(422, "invalid_request");
    let before = sandbox.get("").await;
    let extended = sandbox
        .post("/timeout", json!({ "timeout_secs": 3600 }))
        .await;
    assert_eq!(extended.status, StatusCode::OK, "{}", extended.body);
    assert!(extended.body["expires_at"].as_str() > before.body["expires_at"].as_str());
}

/// Destroy: gone from the worker and containerd; later calls say it is not running; a
/// second destroy is not an error; each change is audited once.
async fn destroyed_sandboxes_are_gone(sandbox: &TestSandbox<'_>, worker: &TestWorker) {
    assert_eq!(sandbox.delete("").await.status, StatusCode::NO_CONTENT);
    let after = sandbox.get("").await;
    assert_eq!(
        (
            after.body["state"].as_str(),
            after.body["stop_reason"].as_str()
        ),
        (Some("stopped"), Some("destroyed"))
    );
    sandbox
        .exec(json!({ "cmd": ["true"] }))
        .await
        .assert_error(409, "sandbox_not_running");
    assert_eq!(sandbox.delete("").await.status, StatusCode::NO_CONTENT);
    assert!(worker.running().node().ids().is_empty());
    let audit = sandbox.app.count("SELECT count(*) FROM audit_events WHERE action IN ('sandbox.create', 'sandbox.destroy', 'sandbox.extend') AND outcome = 'success'").await;
    assert_eq!(audit, 3);
}

/// Every route with another team's sandbox id answers 404, and changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn another_teams_sandbox_is_not_found_on_every_route() {
    let app = sandbox_app().await;
    let worker = TestWorker::start(worker_config(&app, "w", 4, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let mallory = app.signup("mallory@example.com", "Mallory").await;
    let id = create_ok(&app, &alice.api_key.token, json!({})).await;
    sh(
        &app,
        &alice.api_key.token,
        &id,
        "echo secret > /work/secret",
    )
    .await;
    let evil = mallory.api_key.token.as_str();
    let routes: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, format!("/v1/sandboxes/{id}"), None),
        (Method::DELETE, format!("/v1/sandboxes/{id}"), None),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/timeout"),
            Some(json!({ "timeout_secs": 10 })),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "cmd": ["cat", "/work/secret"] })),
        ),
        (Method::GET, format!("/v1/sandboxes/{id}/processes"), None),
        (Method::GET, format!("/v1/sandboxes/{id}/processes/1"), None),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/processes/1/signal"),
            Some(json!({ "signal": 9 })),
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{id}/files?path=/work/secret"),
            None,
        ),
        (
            Method::DELETE,
            format!("/v1/sandboxes/{id}/files?path=/work/secret"),
            None,
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{id}/archive?path=/work"),
            None,
        ),
    ];
    for (method, path, body) in routes {
        let answer = app.request(method.clone(), &path, Some(evil), body).await;
        assert_eq!(
            answer.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {}",
            answer.body
        );
    }
    for (method, path) in [
        (
            Method::PUT,
            format!("/v1/sandboxes/{id}/files?path=/work/secret"),
        ),
        (
            Method::PUT,
            format!("/v1/sandboxes/{id}/archive?path=/work"),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/processes/1/stdin"),
        ),
    ] {
        let (status, _, _) = raw(&app, method.clone(), &path, evil, Some(b"x".to_vec())).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
    }
    let listed = app.get("/v1/sandboxes", evil).await;
    assert_eq!(listed.body["sandboxes"], json!([]));
    // A random id is the same 404.
    app.get(&format!("/v1/sandboxes/{}", Uuid::new_v4()), evil)
        .await
        .assert_error(404, "not_found");
    // Alice's sandbox is untouched.
    let result = sh(&app, &alice.api_key.token, &id, "cat /work/secret").await;
    assert_eq!(result["stdout"], "secret\n");
    let still = app
        .get(&format!("/v1/sandboxes/{id}"), &alice.api_key.token)
        .await;
    assert_eq!(still.body["state"], "running");
    worker.clean_up().await;
}

/// Expiry destroys a sandbox; a worker that dies with sandboxes running loses them, and the
/// next worker on the node removes every trace.
#[tokio::test(flavor = "multi_thread")]
async fn expired_and_crashed_sandboxes_leave_nothing_behind() {
    let app = sandbox_app().await;
    let config = worker_config(&app, "w", 4, 1);
    let mut worker = TestWorker::start(config.clone()).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();

    let short = create_ok(&app, token, json!({ "timeout_secs": 1 })).await;
    wait_until("expiry", Duration::from_secs(10), || async {
        let answer = app.get(&format!("/v1/sandboxes/{short}"), token).await;
        answer.body["stop_reason"] == "expired"
    })
    .await;
    wait_until(
        "the expired sandbox's removal",
        Duration::from_secs(10),
        || async { worker.running().node().ids().is_empty() },
    )
    .await;

    let doomed = create_ok(&app, token, json!({})).await;
    sh(&app, token, &doomed, "sleep 1000 &").await;
    assert!(!worker.containers().await.is_empty());
    // The worker dies without cleaning up; its containers keep running.
    worker.running.take().unwrap().abandon();
    assert!(!worker.containers().await.is_empty());
    // The next worker on the node removes them and the gateway marks the sandbox lost.
    worker.running = Some(service::start(config).await.unwrap());
    wait_until(
        "the sandbox to be lost",
        Duration::from_secs(10),
        || async {
            let answer = app.get(&format!("/v1/sandboxes/{doomed}"), token).await;
            answer.body["stop_reason"] == "lost"
        },
    )
    .await;
    exec(&app, token, &doomed, json!({ "cmd": ["true"] }))
        .await
        .assert_error(409, "sandbox_not_running");
    // And new sandboxes work on the restarted worker.
    let fresh = create_ok(&app, token, json!({})).await;
    assert_eq!(sh(&app, token, &fresh, "echo ok").await["stdout"], "ok\n");
    let lost_audit = app
        .count("SELECT count(*) FROM audit_events WHERE action = 'sandbox.lost'")
        .await;
    assert_eq!(lost_audit, 1);
    worker.clean_up().await;
}

/// Two workers behind one gateway share the load; when both are full, creates are refused
/// with `no_capacity`, and a destroy makes room again.
#[tokio::test(flavor = "multi_thread")]
async fn two_workers_share_sandboxes_and_full_workers_refuse() {
    let app = sandbox_app().await;
    let first = TestWorker::start(worker_config(&app, "one", 1, 0)).await;
    let second = TestWorker::start(worker_config(&app, "two", 1, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    // Wait until both have registered.
    wait_until("two workers", Duration::from_secs(10), || async {
        app.count("SELECT count(*) FROM workers").await == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let a = create_ok(&app, token, json!({})).await;
    let b = create_ok(&app, token, json!({})).await;
    let workers = app
        .count(&format!(
            "SELECT count(DISTINCT worker_id) FROM sandboxes WHERE id IN ('{a}', '{b}')"
        ))
        .await;
    assert_eq!(workers, 2, "both workers host one sandbox");
    app.post("/v1/sandboxes", token, json!({}))
        .await
        .assert_error(503, "no_capacity");
    // Refused creates leave no running row behind.
    assert_eq!(
        app.count("SELECT count(*) FROM sandboxes WHERE state <> 'stopped'")
            .await,
        2
    );
    for id in [&a, &b] {
        assert_eq!(sh(&app, token, id, "echo up").await["stdout"], "up\n");
    }
    assert_eq!(
        app.delete(&format!("/v1/sandboxes/{a}"), token)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let c = create_ok(&app, token, json!({})).await;
    assert_eq!(sh(&app, token, &c, "echo up").await["stdout"], "up\n");
    // Bad input is refused before any worker is asked.
    for body in [
        json!({ "template": "no-such-template" }),
        json!({ "resources": { "memory_mb": 1_000_000 } }),
        json!({ "timeout_secs": 0 }),
        json!({ "cwd": "relative" }),
        json!({ "env": { "A=B": "x" } }),
        json!({ "unknown": true }),
    ] {
        let answer = app.post("/v1/sandboxes", token, body.clone()).await;
        assert_eq!(answer.status.as_u16(), 422, "{body}: {}", answer.body);
    }
    // Internal routes refuse callers without the node token, and are not on the public
    // listener at all.
    let heartbeat =
        json!({ "id": "x", "url": "http://x", "capacity": 1, "templates": [], "sandboxes": [] });
    let answer = app
        .internal_http
        .post(format!("{}/internal/v1/workers/heartbeat", app.internal))
        .json(&heartbeat)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
    let answer = app
        .request(
            Method::POST,
            "/internal/v1/workers/heartbeat",
            None,
            Some(heartbeat),
        )
        .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    first.clean_up().await;
    second.clean_up().await;
}
