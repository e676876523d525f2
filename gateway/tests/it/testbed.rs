//! What tests that need sandboxes share: a gateway with the test template and sizes, real
//! workers on SandBase's containerd (each its own namespace, run directory and id range),
//! and [`TestSandbox`], a sandbox of a team driven through the public API.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use sandbase_api::sandboxes::Isolation;
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

/// What a worker named `worker_id` holds to speak to the test gateways.
pub fn worker_credential(worker_id: &str) -> String {
    sandbase_gateway::operator::worker_credential(&NODE_TOKEN.to_owned().into(), worker_id)
}

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
    sandbox_app_isolated(Isolation::Runc).await
}

/// Both isolation levels: the suites that run every attack under each.
pub const ISOLATIONS: [Isolation; 2] = [Isolation::Runc, Isolation::Gvisor];

/// A gateway whose sandboxes are isolated by `isolation` unless they ask otherwise.
pub async fn sandbox_app_isolated(isolation: Isolation) -> TestApp {
    spawn_app_with(move |settings| {
        configure_sandboxes(settings);
        settings.sandboxes.default_isolation = isolation;
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
    let worker_id = format!("{id}-{unique}");
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
            runsc: Some(
                sandbase_worker::gvisor::find_runsc()
                    .expect("runsc (gVisor) on the PATH: scripts/setup installs it"),
            ),
        },
        node: NodeConfig {
            capacity,
            pools: vec![("busybox".to_owned(), warm)],
            default_limits: LIMITS,
            process_output_limit: 1024 * 1024,
            memory_mb: 0,
            memory_overcommit: 1.0,
            cpu_millis: 0,
            cpu_overcommit: 64.0,
            volumes: Default::default(),
            egress: None,
        },
        listen: "127.0.0.1:0".parse().unwrap(),
        advertise_url: None,
        gateway_url: app.internal.clone(),
        credential: worker_credential(&worker_id),
        tls: app
            .settings
            .internal_tls
            .as_ref()
            .map(|_| sandbase_gateway::testing::channel()),
        worker_id,
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
        // A destroy the gateway asked for just before (a sandbox that failed) may still be
        // under way: it must finish, and leave nothing.
        let deadline = Instant::now() + Duration::from_secs(15);
        while !containerd.sandbox_ids().await.unwrap().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(containerd.sandbox_ids().await.unwrap().is_empty());
        assert!(containerd.sandbox_snapshots().await.unwrap().is_empty());
        containerd.remove_template("busybox").await.unwrap();
        for template in templates {
            containerd.remove_template(template).await.unwrap();
        }
        // Nothing of the test stays in containerd, not even its empty namespace.
        containerd.remove_namespace().await.unwrap();
        let _ = sandbase_worker::runtime::remove_run_dir(&self.config.worker.run_dir);
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

/// A running sandbox of a team, driven through the public API.
pub struct TestSandbox<'a> {
    pub app: &'a TestApp,
    pub token: String,
    pub id: String,
}

impl<'a> TestSandbox<'a> {
    /// Creates a sandbox (waiting for a worker) and checks it runs.
    pub async fn create(app: &'a TestApp, token: &str, body: Value) -> TestSandbox<'a> {
        let id = create_ok(app, token, body).await;
        TestSandbox {
            app,
            token: token.to_owned(),
            id,
        }
    }

    /// The sandbox's own API path, with `suffix` (`/exec`, `/files?path=…`).
    pub fn path(&self, suffix: &str) -> String {
        format!("/v1/sandboxes/{}{suffix}", self.id)
    }

    /// Runs a command (`cmd` or `command` and the rest of an exec request).
    pub async fn exec(&self, body: Value) -> Answer {
        exec(self.app, &self.token, &self.id, body).await
    }

    /// Runs a shell command as the sandbox user; the result body (the call must succeed).
    pub async fn sh(&self, command: &str) -> Value {
        sh(self.app, &self.token, &self.id, command).await
    }

    pub async fn get(&self, suffix: &str) -> Answer {
        self.app.get(&self.path(suffix), &self.token).await
    }

    pub async fn post(&self, suffix: &str, body: Value) -> Answer {
        self.app.post(&self.path(suffix), &self.token, body).await
    }

    pub async fn delete(&self, suffix: &str) -> Answer {
        self.app.delete(&self.path(suffix), &self.token).await
    }

    /// A raw call on the sandbox's path: status, body bytes, headers.
    pub async fn raw(
        &self,
        method: Method,
        suffix: &str,
        body: Option<Vec<u8>>,
    ) -> (StatusCode, Vec<u8>, reqwest::header::HeaderMap) {
        raw(self.app, method, &self.path(suffix), &self.token, body).await
    }

    /// Writes a file; the status and the answer's body.
    pub async fn put_file(&self, path: &str, content: Vec<u8>) -> (StatusCode, Vec<u8>) {
        let (status, body, _) = self
            .raw(Method::PUT, &format!("/files?path={path}"), Some(content))
            .await;
        (status, body)
    }

    /// Reads a file: the status, its bytes and the answer's headers.
    pub async fn get_file(&self, path: &str) -> (StatusCode, Vec<u8>, reqwest::header::HeaderMap) {
        self.raw(Method::GET, &format!("/files?path={path}"), None)
            .await
    }
}

/// A run once it completed or failed (within 90 s).
pub async fn finished_run(app: &TestApp, token: &str, run_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let run = app.get(&format!("/v1/runs/{run_id}"), token).await.body;
        if run["state"] == "completed" || run["state"] == "failed" {
            return run;
        }
        assert!(Instant::now() < deadline, "the run: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every stopped sandbox's last sample is charged.
pub async fn all_metered(app: &TestApp) -> bool {
    app.count("SELECT count(*) FROM sandboxes WHERE state = 'stopped' AND NOT metered_final")
        .await
        == 0
}
