//! Sandboxes end to end: a real gateway, real workers on SandBase's containerd (each test
//! its own containerd namespace, run directory and id range), real PostgreSQL and Redis.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use sandbase_worker::node::NodeConfig;
use sandbase_worker::runtime::RuntimeConfig;
use sandbase_worker::service::{self, RunningService, ServiceConfig, TemplateSource};
use sandbase_worker::spec::Limits;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{Answer, TestApp, spawn_app_with};

pub const NODE_TOKEN: &str = "test-node-token-0123456789";

pub const LIMITS: Limits = Limits {
    cpu_millis: 1000,
    memory_mb: 128,
    disk_mb: 64,
    pids: 64,
};

/// The node token, the busybox template and the test size.
pub fn configure_sandboxes(settings: &mut sandbase_gateway::Settings) {
    settings.workers.node_token = Some(NODE_TOKEN.to_owned().into());
    settings.sandboxes.default_template = "busybox".to_owned();
    settings.sandboxes.default_resources.cpu_millis = LIMITS.cpu_millis;
    settings.sandboxes.default_resources.memory_mb = LIMITS.memory_mb;
    settings.sandboxes.default_resources.disk_mb = LIMITS.disk_mb;
    settings.sandboxes.default_resources.pids = LIMITS.pids;
}

pub async fn sandbox_app() -> TestApp {
    spawn_app_with(|settings| {
        configure_sandboxes(settings);
        settings.workers.heartbeat_ttl_secs = 5;
        settings.workers.lost_after_secs = 5;
        settings.runs.artifacts_dir =
            std::env::temp_dir().join(format!("sandbase-artifacts-{}", Uuid::new_v4().simple()));
    })
    .await
}

/// A worker of its own for `app`: a fresh containerd namespace, run directory and id range.
pub struct TestWorker {
    pub config: ServiceConfig,
    pub running: Option<RunningService>,
}

pub fn worker_config(app: &TestApp, id: &str, capacity: usize, warm: usize) -> ServiceConfig {
    let unique = Uuid::new_v4().simple().to_string();
    let slot = u32::from_str_radix(&unique[..4], 16).unwrap() % 1000;
    ServiceConfig {
        worker: RuntimeConfig {
            containerd_socket: PathBuf::from(
                std::env::var("SANDBASE_CONTAINERD_SOCKET")
                    .unwrap_or_else(|_| "/run/sandbase/containerd.sock".to_owned()),
            ),
            namespace: format!("sandbase-test-{unique}"),
            agent_binary: PathBuf::from(
                std::env::var("SANDBASE_AGENT_BINARY")
                    .expect("SANDBASE_AGENT_BINARY: the static agent (scripts/test builds it)"),
            ),
            run_dir: std::env::temp_dir().join(format!("sandbase-gw-run-{unique}")),
            id_base: 2_000_000 + slot * 65_536,
        },
        node: NodeConfig {
            capacity,
            pools: vec![("busybox".to_owned(), warm)],
            default_limits: LIMITS,
            process_output_limit: 1024 * 1024,
            volumes: Default::default(),
            egress: None,
        },
        listen: "127.0.0.1:0".parse().unwrap(),
        advertise_url: None,
        gateway_url: app.address.clone(),
        node_token: NODE_TOKEN.to_owned(),
        worker_id: format!("{id}-{unique}"),
        heartbeat_interval: Duration::from_millis(300),
        usage_interval: Duration::from_millis(500),
        templates: vec![("busybox".to_owned(), TemplateSource::Busybox)],
    }
}

impl TestWorker {
    pub async fn start(config: ServiceConfig) -> TestWorker {
        let running = service::start(config.clone())
            .await
            .expect("start a worker");
        TestWorker {
            config,
            running: Some(running),
        }
    }

    pub fn running(&self) -> &RunningService {
        self.running.as_ref().expect("the worker runs")
    }

    /// Container ids of sandboxes in this worker's containerd namespace.
    pub async fn containers(&self) -> Vec<String> {
        let containerd = sandbase_worker::containerd::Containerd::connect(
            &self.config.worker.containerd_socket,
            &self.config.worker.namespace,
        )
        .await
        .unwrap();
        containerd.sandbox_ids().await.unwrap()
    }

    /// Stops the worker (destroying its sandboxes) and removes its template and run directory.
    pub async fn clean_up(self) {
        self.clean_up_with(&[]).await;
    }

    /// [`TestWorker::clean_up`], removing these templates too.
    pub async fn clean_up_with(mut self, templates: &[&str]) {
        if let Some(running) = self.running.take() {
            running.stop().await;
        }
        let containerd = sandbase_worker::containerd::Containerd::connect(
            &self.config.worker.containerd_socket,
            &self.config.worker.namespace,
        )
        .await
        .unwrap();
        assert!(containerd.sandbox_ids().await.unwrap().is_empty());
        assert!(containerd.sandbox_snapshots().await.unwrap().is_empty());
        containerd.remove_template("busybox").await.unwrap();
        for template in templates {
            containerd.remove_template(template).await.unwrap();
        }
        // Nothing of the test stays in containerd, not even its empty namespace.
        containerd.remove_namespace().await.unwrap();
        let _ = std::fs::remove_dir_all(&self.config.worker.run_dir);
    }
}

/// Creates a sandbox, waiting (up to 20 s) for a worker to have registered.
pub async fn create(app: &TestApp, token: &str, body: Value) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = app.post("/v1/sandboxes", token, body.clone()).await;
        let waiting = matches!(answer.code(), "no_workers" | "template_not_found");
        if !waiting || Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn create_ok(app: &TestApp, token: &str, body: Value) -> String {
    let answer = create(app, token, body).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(answer.body["state"], "running");
    answer.body["id"].as_str().unwrap().to_owned()
}

pub async fn exec(app: &TestApp, token: &str, id: &str, body: Value) -> Answer {
    app.post(&format!("/v1/sandboxes/{id}/exec"), token, body)
        .await
}

/// Runs a shell command as the sandbox user and returns the result body.
pub async fn sh(app: &TestApp, token: &str, id: &str, command: &str) -> Value {
    let answer = exec(app, token, id, json!({ "command": command })).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body
}

pub async fn raw(
    app: &TestApp,
    method: Method,
    path: &str,
    token: &str,
    body: Option<Vec<u8>>,
) -> (StatusCode, Vec<u8>, reqwest::header::HeaderMap) {
    let mut request = app
        .http
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    (status, response.bytes().await.unwrap().to_vec(), headers)
}

pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_runs_commands_moves_files_and_is_gone_after_destroy() {
    let app = sandbox_app().await;
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
    let id = answer.body["id"].as_str().unwrap().to_owned();
    assert_eq!(answer.body["template"], "busybox");
    assert_eq!(answer.body["cwd"], "/work");

    // Commands: output, exit codes, users, env, stdin, not found, timeouts.
    let result = sh(&app, token, &id, "echo $GREETING; echo oops >&2; exit 3").await;
    assert_eq!(
        (&result["stdout"], &result["stderr"], &result["exit_code"]),
        (&json!("hello\n"), &json!("oops\n"), &json!(3))
    );
    let result = exec(&app, token, &id, json!({ "cmd": ["id", "-u"] })).await;
    assert_eq!(result.body["stdout"], "1000\n");
    let result = exec(
        &app,
        token,
        &id,
        json!({ "cmd": ["id", "-u"], "user": "root" }),
    )
    .await;
    assert_eq!(result.body["stdout"], "0\n");
    let result = exec(
        &app,
        token,
        &id,
        json!({ "cmd": ["pwd"], "cwd": "/tmp", "env": { "A": "1" } }),
    )
    .await;
    assert_eq!(result.body["stdout"], "/tmp\n");
    let result = exec(
        &app,
        token,
        &id,
        json!({ "cmd": ["cat"], "stdin": "from stdin" }),
    )
    .await;
    assert_eq!(result.body["stdout"], "from stdin");
    let result = exec(&app, token, &id, json!({ "cmd": ["no-such-program"] })).await;
    assert_eq!(result.body["exit_code"], 127, "{}", result.body);
    let started = Instant::now();
    let result = exec(
        &app,
        token,
        &id,
        json!({ "command": "sleep 30", "timeout_secs": 1 }),
    )
    .await;
    assert_eq!(result.body["timed_out"], true, "{}", result.body);
    assert!(started.elapsed() < Duration::from_secs(10));
    exec(&app, token, &id, json!({ "cmd": [] }))
        .await
        .assert_error(422, "invalid_request");
    exec(
        &app,
        token,
        &id,
        json!({ "cmd": ["true"], "command": "true" }),
    )
    .await
    .assert_error(422, "invalid_request");

    // Streaming: NDJSON, pid first, exit last.
    let response = app
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec", app.address))
        .bearer_auth(token)
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

    // Background processes: stdin, output, signals.
    let started = exec(
        &app,
        token,
        &id,
        json!({ "command": "while read line; do echo got $line; done", "background": true }),
    )
    .await;
    assert_eq!(started.status, StatusCode::CREATED, "{}", started.body);
    let pid = started.body["pid"].as_u64().unwrap();
    let listed = app
        .get(&format!("/v1/sandboxes/{id}/processes"), token)
        .await;
    assert_eq!(listed.body["processes"][0]["pid"], pid);
    assert_eq!(listed.body["processes"][0]["running"], true);
    let (status, _, _) = raw(
        &app,
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes/{pid}/stdin"),
        token,
        Some(b"one\ntwo\n".to_vec()),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    wait_until("background output", Duration::from_secs(5), || async {
        let process = app
            .get(&format!("/v1/sandboxes/{id}/processes/{pid}"), token)
            .await;
        process.body["stdout"] == "got one\ngot two\n"
    })
    .await;
    let signalled = app
        .post(
            &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
            token,
            json!({ "signal": "TERM" }),
        )
        .await;
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
            let process = app
                .get(&format!("/v1/sandboxes/{id}/processes/{pid}"), token)
                .await;
            process.body["running"] == false && process.body["exit_code"] == 143
        },
    )
    .await;
    app.post(
        &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
        token,
        json!({ "signal": "NOPE" }),
    )
    .await
    .assert_error(422, "invalid_request");
    app.get(&format!("/v1/sandboxes/{id}/processes/999999"), token)
        .await
        .assert_error(404, "process_not_found");

    // Files: binary-safe, larger than a frame, directory listings, removal.
    let content: Vec<u8> = (0..5 * 1024 * 1024 + 17)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let (status, body, _) = raw(
        &app,
        Method::PUT,
        &format!("/v1/sandboxes/{id}/files?path=data/blob.bin"),
        token,
        Some(content.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let info: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(info["path"], "/work/data/blob.bin");
    assert_eq!(info["size"], content.len());
    let (status, body, headers) = raw(
        &app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/files?path=/work/data/blob.bin"),
        token,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert!(body == content, "the file came back different");
    let result = sh(&app, token, &id, "stat -c '%u %s' /work/data/blob.bin").await;
    assert_eq!(result["stdout"], format!("1000 {}\n", content.len()));
    let listing = app
        .get(&format!("/v1/sandboxes/{id}/files?path=/work/data"), token)
        .await;
    assert_eq!(
        listing.body["entries"][0]["name"], "blob.bin",
        "{}",
        listing.body
    );
    assert_eq!(listing.body["entries"][0]["kind"], "file");
    app.get(&format!("/v1/sandboxes/{id}/files?path=/nope"), token)
        .await
        .assert_error(404, "path_not_found");
    app.delete(&format!("/v1/sandboxes/{id}/files?path=/work/data"), token)
        .await
        .assert_error(409, "directory_not_empty");
    let removed = app
        .delete(
            &format!("/v1/sandboxes/{id}/files?path=/work/data&recursive=true"),
            token,
        )
        .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT);
    app.get(
        &format!("/v1/sandboxes/{id}/files?path=/work/data/blob.bin"),
        token,
    )
    .await
    .assert_error(404, "path_not_found");
    // A file over the disk cap fails and leaves nothing half-written.
    let (status, _, _) = raw(
        &app,
        Method::PUT,
        &format!("/v1/sandboxes/{id}/files?path=big"),
        token,
        Some(vec![0u8; (LIMITS.disk_mb as usize + 8) * 1024 * 1024]),
    )
    .await;
    assert!(
        status.is_server_error() || status.is_client_error(),
        "{status}"
    );
    let result = sh(&app, token, &id, "ls -A /work").await;
    assert_eq!(result["stdout"], "", "leftovers: {}", result["stdout"]);

    // Archives: a directory in, and out again.
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
    let (status, body, _) = raw(
        &app,
        Method::PUT,
        &format!("/v1/sandboxes/{id}/archive?path=/work/project"),
        token,
        Some(tar.stdout),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let result = sh(&app, token, &id, "cat /work/project/a.txt /work/project/sub/b.txt; echo x > /work/project/sub/c.txt; stat -c %u /work/project/sub").await;
    assert_eq!(result["stdout"], "alphabeta1000\n");
    let (status, body, headers) = raw(
        &app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/archive?path=/work/project"),
        token,
        None,
    )
    .await;
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
    // A hostile archive cannot write outside its directory.
    std::fs::write(scratch.join("evil.txt"), "evil").unwrap();
    let evil = Command::new("tar")
        .arg("-C")
        .arg(&scratch)
        .args(["-cf", "-", "-P", "--transform", "s|^|../../|", "evil.txt"])
        .output()
        .unwrap();
    let (status, _, _) = raw(
        &app,
        Method::PUT,
        &format!("/v1/sandboxes/{id}/archive?path=/work/project"),
        token,
        Some(evil.stdout),
    )
    .await;
    assert!(status.is_client_error(), "{status}");
    let result = sh(&app, token, &id, "ls /evil.txt /work/evil.txt 2>&1; true").await;
    assert!(
        !result["stdout"].as_str().unwrap().contains("evil.txt\n"),
        "{}",
        result["stdout"]
    );
    std::fs::remove_dir_all(&scratch).unwrap();

    // Listing, filters, timeout extension.
    let listed = app
        .get("/v1/sandboxes?state=running&metadata.purpose=test", token)
        .await;
    assert_eq!(listed.body["sandboxes"][0]["id"], id.as_str());
    let listed = app.get("/v1/sandboxes?metadata.purpose=other", token).await;
    assert_eq!(listed.body["sandboxes"], json!([]));
    app.get("/v1/sandboxes?state=bogus", token)
        .await
        .assert_error(422, "invalid_request");
    let before = app.get(&format!("/v1/sandboxes/{id}"), token).await;
    let extended = app
        .post(
            &format!("/v1/sandboxes/{id}/timeout"),
            token,
            json!({ "timeout_secs": 3600 }),
        )
        .await;
    assert_eq!(extended.status, StatusCode::OK, "{}", extended.body);
    assert!(extended.body["expires_at"].as_str() > before.body["expires_at"].as_str());

    // Destroy: gone from the worker and containerd; later calls say it is not running.
    assert_eq!(
        app.delete(&format!("/v1/sandboxes/{id}"), token)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let after = app.get(&format!("/v1/sandboxes/{id}"), token).await;
    assert_eq!(
        (
            after.body["state"].as_str(),
            after.body["stop_reason"].as_str()
        ),
        (Some("stopped"), Some("destroyed"))
    );
    exec(&app, token, &id, json!({ "cmd": ["true"] }))
        .await
        .assert_error(409, "sandbox_not_running");
    assert_eq!(
        app.delete(&format!("/v1/sandboxes/{id}"), token)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert!(worker.running().node().ids().is_empty());
    let audit = app.count("SELECT count(*) FROM audit_events WHERE action IN ('sandbox.create', 'sandbox.destroy', 'sandbox.extend') AND outcome = 'success'").await;
    assert_eq!(audit, 3);
    worker.clean_up().await;
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

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
/// Hostile commands through the API: each fails, and the sandbox and its neighbour keep working.
#[tokio::test(flavor = "multi_thread")]
async fn attacks_from_inside_a_sandbox_fail_and_the_node_keeps_working() {
    let app = sandbox_app().await;
    let worker = TestWorker::start(worker_config(&app, "w", 4, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    let id = create_ok(&app, token, json!({})).await;
    let neighbour = create_ok(&app, token, json!({})).await;
    sh(&app, token, &neighbour, "echo mine > /work/mine").await;

    // Host files: a marker on the host is not visible; a link to /etc/shadow downloads the
    // sandbox's own file (busybox has none), never the host's.
    let marker = format!("/tmp/sandbase-host-marker-{}", Uuid::new_v4().simple());
    std::fs::write(&marker, "host secret").unwrap();
    let result = sh(&app, token, &id, &format!("cat {marker}")).await;
    assert_ne!(result["exit_code"], 0);
    let host_shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    sh(
        &app,
        token,
        &id,
        "ln -s /etc/shadow /work/x; ln -s / /work/root",
    )
    .await;
    let (status, body, _) = raw(
        &app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/files?path=/work/x"),
        token,
        None,
    )
    .await;
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
    for (command, user) in [
        ("mount -t tmpfs none /mnt", "root"),
        ("unshare -r true", "user"),
        ("unshare -m true", "root"),
        ("kill -9 1", "user"),
        ("cat /proc/1/environ", "user"),
        ("ls /.sandbase/run", "user"),
        ("echo x > /bin/x", "root"),
    ] {
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
    assert_eq!(bomb.status, StatusCode::OK, "{}", bomb.body);
    exec(
        &app,
        token,
        &id,
        json!({ "command": "kill -9 -1", "user": "user" }),
    )
    .await;
    let hog = sh(
        &app,
        token,
        &id,
        "awk 'BEGIN { s = \"x\"; for (i = 0; i < 40; i++) s = s s; print length(s) }'",
    )
    .await;
    assert_ne!(hog["exit_code"], 0);
    let fill = sh(
        &app,
        token,
        &id,
        "dd if=/dev/zero of=/work/fill bs=1M count=200",
    )
    .await;
    assert!(
        fill["stderr"].as_str().unwrap().contains("No space left"),
        "{}",
        fill
    );

    // Both sandboxes still answer, and the neighbour kept its files.
    let result = sh(&app, token, &id, "rm -f /work/fill; echo alive").await;
    assert_eq!(result["stdout"], "alive\n");
    let result = sh(&app, token, &neighbour, "cat /work/mine").await;
    assert_eq!(result["stdout"], "mine\n");
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
    // Internal routes refuse callers without the node token.
    let answer = app
        .request(Method::POST, "/internal/v1/workers/heartbeat", None, Some(json!({ "id": "x", "url": "http://x", "capacity": 1, "templates": [], "sandboxes": [] })))
        .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    first.clean_up().await;
    second.clean_up().await;
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
/// Volumes: only what a sandbox asks for, read-only unless the volume is writable; nothing
/// for sandboxes that did not ask; unknown volumes and reserved paths refused.
#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_mount_only_the_volumes_they_ask_for() {
    let app = sandbox_app().await;
    let mut config = worker_config(&app, "w", 4, 1);
    let shared = std::env::temp_dir().join(format!("sandbase-volume-{}", Uuid::new_v4().simple()));
    let scratch = std::env::temp_dir().join(format!("sandbase-volume-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(shared.join("readme.txt"), "shared data\n").unwrap();
    // The sandbox user is host uid id_base + 1000: the operator gives it the writable volume.
    let user = config.worker.id_base + 1000;
    std::os::unix::fs::chown(&scratch, Some(user), Some(user)).unwrap();
    config.node.volumes = [
        ("shared".to_owned(), (shared.clone(), false)),
        ("scratch".to_owned(), (scratch.clone(), true)),
    ]
    .into();
    let worker = TestWorker::start(config).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();

    let answer = create(
        &app,
        token,
        json!({ "mounts": [
            { "volume": "shared", "path": "/data" },
            { "volume": "scratch", "path": "/work/scratch", "read_only": false },
        ] }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(answer.body["mounts"][0]["read_only"], true);
    let id = answer.body["id"].as_str().unwrap().to_owned();
    let result = sh(
        &app,
        token,
        &id,
        "cat /data/readme.txt; echo new > /work/scratch/out.txt && echo wrote",
    )
    .await;
    assert_eq!(result["stdout"], "shared data\nwrote\n", "{result}");
    assert_eq!(
        std::fs::read_to_string(scratch.join("out.txt")).unwrap(),
        "new\n"
    );
    for command in [
        "echo x > /data/readme.txt",
        "rm /data/readme.txt",
        "touch /data/new",
    ] {
        let result = sh(&app, token, &id, command).await;
        assert_ne!(result["exit_code"], 0, "`{command}` succeeded");
    }
    assert_eq!(
        std::fs::read_to_string(shared.join("readme.txt")).unwrap(),
        "shared data\n"
    );

    // A sandbox that asked for nothing sees nothing of them.
    let plain = create_ok(&app, token, json!({})).await;
    let result = sh(
        &app,
        token,
        &plain,
        "ls /data /work/scratch 2>&1; cat /data/readme.txt",
    )
    .await;
    assert!(
        !result["stdout"].as_str().unwrap().contains("shared data"),
        "{result}"
    );

    // Refused: unknown volume, writable mount of a read-only volume, reserved paths.
    app.post(
        "/v1/sandboxes",
        token,
        json!({ "mounts": [{ "volume": "nope", "path": "/data" }] }),
    )
    .await
    .assert_error(422, "volume_not_found");
    app.post(
        "/v1/sandboxes",
        token,
        json!({ "mounts": [{ "volume": "shared", "path": "/data", "read_only": false }] }),
    )
    .await
    .assert_error(422, "volume_not_found");
    for path in [
        "/etc",
        "/proc/x",
        "/.sandbase/run",
        "/work",
        "/",
        "relative",
        "/a/../etc",
    ] {
        let answer = app
            .post(
                "/v1/sandboxes",
                token,
                json!({ "mounts": [{ "volume": "shared", "path": path }] }),
            )
            .await;
        assert_eq!(answer.status.as_u16(), 422, "{path}: {}", answer.body);
    }
    assert_eq!(
        app.count("SELECT count(*) FROM sandboxes WHERE state = 'running'")
            .await,
        2
    );
    worker.clean_up().await;
    std::fs::remove_dir_all(&shared).unwrap();
    std::fs::remove_dir_all(&scratch).unwrap();
}

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

/// Every stopped sandbox's last sample is charged.
pub async fn all_metered(app: &TestApp) -> bool {
    app.count("SELECT count(*) FROM sandboxes WHERE state = 'stopped' AND NOT metered_final")
        .await
        == 0
}
