//! Sandboxes through the public API, against raw containerd in the same run.
//!
//! - create → ready: `POST /v1/sandboxes` then the first `exec` of `true` answered, from a
//!   warm pool and cold (a size no warm sandbox has), over BENCH_CREATES (100) each;
//!   baseline `ctr run --rm` of the same busybox root file system running `true`.
//! - exec: `POST /v1/sandboxes/{id}/exec` of `true`, BENCH_EXECS (1000) in a row, against
//!   `ctr task exec` of `true` in the same container.
//! - previews: an HTTP GET through a preview URL vs a connection made inside the sandbox's
//!   network namespace by the benchmark itself; terminals and snapshots (their own files);
//!   `tools/call exec` over `/mcp` vs the REST exec it wraps (`sandbox_api/mcp.rs`).
//! - density: idle sandboxes started until BENCH_DENSITY (300) run; host memory per idle
//!   sandbox from MemAvailable before and after (container, shim, agent, kernel).
//!
//! Needs what the gateway tests need (scripts/setup's PostgreSQL, Redis and containerd, the
//! static agent in SANDBASE_AGENT_BINARY):
//! `SANDBASE_AGENT_BINARY=… cargo bench -p sandbase-gateway --bench sandbox_api`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use sandbase_gateway::{Application, testing};
use sandbase_worker::node::NodeConfig;
use sandbase_worker::runtime::RuntimeConfig;
use sandbase_worker::service::{self, ServiceConfig, TemplateSource};
use sandbase_worker::spec::Limits;
use serde_json::{Value, json};

const NODE_TOKEN: &str = "bench-node-token-0123456789";
#[path = "sandbox_api/mcp.rs"]
mod mcp;
#[path = "sandbox_api/preview.rs"]
mod preview;
#[path = "sandbox_api/terminal.rs"]
mod terminal;

const LIMITS: Limits = Limits {
    cpu_millis: 1000,
    memory_mb: 128,
    disk_mb: 64,
    pids: 64,
};

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

struct Samples(Vec<Duration>);

impl Samples {
    fn ms(&mut self, fraction: f64) -> f64 {
        self.0.sort_unstable();
        let index = ((self.0.len() as f64 - 1.0) * fraction).round() as usize;
        self.0[index].as_secs_f64() * 1000.0
    }
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Api {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn delete(&self, path: &str) {
        self.http
            .delete(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("request");
    }

    /// Create + first `true`: the time until the sandbox is usable.
    async fn create_ready(&self, body: Value) -> (Duration, String) {
        let started = Instant::now();
        let (status, created) = self.post("/v1/sandboxes", body).await;
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().expect("id").to_owned();
        let (status, result) = self
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                json!({ "cmd": ["true"] }),
            )
            .await;
        assert_eq!((status, &result["exit_code"]), (200, &json!(0)), "{result}");
        (started.elapsed(), id)
    }
}

fn ctr(socket: &str, namespace: &str, args: &[&str]) -> Duration {
    let started = Instant::now();
    let output = Command::new("ctr")
        .args(["--address", socket, "-n", namespace])
        .args(args)
        .output()
        .expect("run ctr");
    assert!(
        output.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    started.elapsed()
}

#[allow(
    clippy::too_many_lines,
    reason = "a benchmark's scenario, measured and reported in one place"
)]
fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::stderr)
        .try_init();
    let creates = env_number("BENCH_CREATES", 100);
    let execs = env_number("BENCH_EXECS", 1000);
    let density = env_number("BENCH_DENSITY", 300);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut settings = testing::settings().await;
        settings.workers.node_token = Some(NODE_TOKEN.to_owned().into());
        settings.sandboxes.default_template = "busybox".to_owned();
        settings.sandboxes.default_resources.memory_mb = LIMITS.memory_mb;
        settings.sandboxes.default_resources.disk_mb = LIMITS.disk_mb;
        settings.sandboxes.default_resources.pids = LIMITS.pids;
        // The density run holds hundreds of sandboxes for one team.
        settings.sandboxes.max_per_team = 100_000;
        settings.previews.domain = Some("preview.localhost".to_owned());
        settings.previews.scheme = "http".to_owned();
        let application = Application::build(settings).await?;
        let url = format!("http://{}", application.local_addr());
        let internal = format!("https://{}", application.internal_addr());
        tokio::spawn(application.run_until_stopped(std::future::pending()));

        let socket = std::env::var("SANDBASE_CONTAINERD_SOCKET")
            .unwrap_or_else(|_| "/run/sandbase/containerd.sock".to_owned());
        let namespace = format!("sandbase-bench-{}", uuid::Uuid::new_v4().simple());
        let run_dir = std::env::temp_dir().join(format!("sandbase-bench-run-{}", uuid::Uuid::new_v4().simple()));
        let config = ServiceConfig {
            worker: RuntimeConfig {
                containerd_socket: PathBuf::from(&socket),
                namespace: namespace.clone(),
                agent_binary: PathBuf::from(std::env::var("SANDBASE_AGENT_BINARY")?),
                run_dir: run_dir.clone(),
                id_base: 5_000_000,
                runsc: None,
            },
            node: NodeConfig {
                capacity: density + 50,
                pools: vec![("busybox".to_owned(), 4)],
                default_limits: LIMITS,
                process_output_limit: 1024 * 1024,
            memory_mb: 0,
            memory_overcommit: 1.0,
            cpu_millis: 0,
            cpu_overcommit: 1000.0,
                volumes: Default::default(),
                egress: None,
            },
            listen: "127.0.0.1:0".parse()?,
            advertise_url: None,
            gateway_url: internal.clone(),
            credential: sandbase_gateway::operator::worker_credential(&NODE_TOKEN.to_owned().into(), "bench"),
            tls: Some(testing::channel()),
            worker_id: "bench".to_owned(),
            heartbeat_interval: Duration::from_millis(500),
            usage_interval: Duration::from_secs(5),
            templates: vec![("busybox".to_owned(), TemplateSource::Busybox)],
        };
        let worker = service::start(config).await?;

        let http = reqwest::Client::new();
        let signup: Value = http
            .post(format!("{url}/v1/auth/signup"))
            .json(&json!({ "email": "bench@example.com", "password": "benchmark password", "team_name": "Bench" }))
            .send()
            .await?
            .json()
            .await?;
        let api = Api {
            http,
            url: url.clone(),
            token: signup["api_key"]["token"].as_str().expect("token").to_owned(),
        };
        // Wait for the worker's registration and a full pool.
        let warm_ready = |count: u32| {
            let node = worker.node().clone();
            async move {
                loop {
                    let warm = node
                        .templates()
                        .await
                        .map(|templates| templates.iter().map(|t| t.warm).sum::<u32>())
                        .unwrap_or(0);
                    if warm >= count {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        loop {
            let (status, body) = api.post("/v1/sandboxes", json!({})).await;
            if status == 201 {
                api.delete(&format!("/v1/sandboxes/{}", body["id"].as_str().expect("id"))).await;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Warm: a pool sandbox is waiting each time (the refill is not timed).
        let mut warm = Samples(Vec::new());
        for _ in 0..creates {
            warm_ready(1).await;
            // Let the snapshot of the worker's heartbeat catch up, as a steady state would.
            let (elapsed, id) = api.create_ready(json!({})).await;
            warm.0.push(elapsed);
            api.delete(&format!("/v1/sandboxes/{id}")).await;
        }
        // Cold: a disk size no warm sandbox has.
        let mut cold = Samples(Vec::new());
        for _ in 0..creates {
            let (elapsed, id) = api
                .create_ready(json!({ "resources": { "disk_mb": LIMITS.disk_mb + 1 } }))
                .await;
            cold.0.push(elapsed);
            api.delete(&format!("/v1/sandboxes/{id}")).await;
        }
        // Baseline: ctr run --rm of the same busybox root file system (outside the worker's
        // run directory, which is noexec).
        let rootfs = std::env::temp_dir().join(format!("sandbase-bench-rootfs-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&rootfs)?;
        sandbase_worker::templates::busybox(&rootfs, 0)?;
        let mut ctr_run = Samples(Vec::new());
        for index in 0..(creates / 5).max(10) {
            ctr_run.0.push(ctr(
                &socket,
                &namespace,
                &["run", "--rm", "--rootfs", rootfs.to_str().expect("utf-8"), &format!("baseline-{index}"), "/bin/true"],
            ));
        }

        // Exec through the gateway vs ctr task exec into the same container.
        warm_ready(1).await;
        let (_, id) = api.create_ready(json!({})).await;
        // Recorded (the default) and not, alternately.
        let (mut gateway_exec, mut unrecorded_exec) = (Samples(Vec::new()), Samples(Vec::new()));
        for _ in 0..execs {
            for (body, samples) in [
                (json!({ "cmd": ["true"] }), &mut gateway_exec),
                (json!({ "cmd": ["true"], "record": false }), &mut unrecorded_exec),
            ] {
                let started = Instant::now();
                let (status, result) = api.post(&format!("/v1/sandboxes/{id}/exec"), body).await;
                assert_eq!((status, &result["exit_code"]), (200, &json!(0)));
                samples.0.push(started.elapsed());
            }
        }
        let container = worker
            .node()
            .get(id.parse()?)
            .map_err(|error| anyhow::anyhow!("{error}"))?
            .sandbox
            .id
            .clone();
        let mut ctr_exec = Samples(Vec::new());
        for index in 0..(execs / 20).max(20) {
            ctr_exec.0.push(ctr(
                &socket,
                &namespace,
                &["task", "exec", "--exec-id", &format!("bench-{index}"), &container, "/bin/true"],
            ));
        }
        // Pause and resume through the gateway (the row, its audit row and the worker's
        // containerd call) vs `ctr task pause|resume` of the same container.
        let (mut pause, mut resume) = (Samples(Vec::new()), Samples(Vec::new()));
        let (mut ctr_pause, mut ctr_resume) = (Samples(Vec::new()), Samples(Vec::new()));
        for _ in 0..(execs / 10).max(20) {
            for (verb, samples) in [("pause", &mut pause), ("resume", &mut resume)] {
                let started = Instant::now();
                let (status, answer) = api.post(&format!("/v1/sandboxes/{id}/{verb}"), json!({})).await;
                assert_eq!(status, 200, "{answer}");
                samples.0.push(started.elapsed());
            }
            ctr_pause.0.push(ctr(&socket, &namespace, &["task", "pause", &container]));
            ctr_resume.0.push(ctr(&socket, &namespace, &["task", "resume", &container]));
        }
        let snapshots = snapshot_samples(&api).await;
        let agent = worker
            .node()
            .get(id.parse()?)
            .map_err(|error| anyhow::anyhow!("{error}"))?
            .sandbox
            .socket
            .clone();
        let terminals = terminal::terminal_samples(&api, &id, &agent, (execs / 2).max(50)).await;
        let previews = preview::preview_samples(&api, worker.node(), &id, (execs / 2).max(50)).await;
        let mcp = mcp::mcp_samples(&api, &id, (execs / 2).max(50)).await;
        api.delete(&format!("/v1/sandboxes/{id}")).await;

        // Density: idle sandboxes until `density` run.
        warm_ready(4).await;
        let before = mem_available_kib();
        let mut ids = Vec::new();
        let started = Instant::now();
        for _ in 0..density {
            let (status, created) = api
                .post("/v1/sandboxes", json!({ "resources": { "memory_mb": 64 } }))
                .await;
            if status != 201 {
                println!("density: stopped at {} sandboxes: {created}", ids.len());
                break;
            }
            ids.push(created["id"].as_str().expect("id").to_owned());
        }
        let reached = ids.len().max(1);
        let density_secs = started.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = mem_available_kib();
        let per_sandbox_mib = (before.saturating_sub(after)) as f64 / 1024.0 / reached as f64;
        let (status, result) = api
            .post(&format!("/v1/sandboxes/{}/exec", ids[ids.len() / 2]), json!({ "cmd": ["true"] }))
            .await;
        assert_eq!((status, &result["exit_code"]), (200, &json!(0)));
        for id in &ids {
            api.delete(&format!("/v1/sandboxes/{id}")).await;
        }
        worker.stop().await;
        let _ = Command::new("ctr")
            .args(["--address", &socket, "-n", &namespace, "snapshots", "rm", "sandbase/template/busybox"])
            .output();
        let _ = sandbase_worker::runtime::remove_run_dir(&run_dir);
        let _ = std::fs::remove_dir_all(&rootfs);

        println!("| measurement | SandBase p50 ms | p99 ms | baseline | p50 ms | p99 ms | ratio (p50) |");
        println!("|---|---|---|---|---|---|---|");
        let (ctr_run_p50, ctr_run_p99) = (ctr_run.ms(0.5), ctr_run.ms(0.99));
        println!(
            "| create → first `true`, warm pool ({creates}) | {:.1} | {:.1} | `ctr run --rm … true` | {ctr_run_p50:.1} | {ctr_run_p99:.1} | {:.2} |",
            warm.ms(0.5),
            warm.ms(0.99),
            warm.ms(0.5) / ctr_run_p50
        );
        println!(
            "| create → first `true`, cold ({creates}) | {:.1} | {:.1} | `ctr run --rm … true` | {ctr_run_p50:.1} | {ctr_run_p99:.1} | {:.2} |",
            cold.ms(0.5),
            cold.ms(0.99),
            cold.ms(0.5) / ctr_run_p50
        );
        let (ctr_exec_p50, ctr_exec_p99) = (ctr_exec.ms(0.5), ctr_exec.ms(0.99));
        println!(
            "| exec `true` through the gateway ({execs}) | {:.2} | {:.2} | `ctr task exec … true` | {ctr_exec_p50:.1} | {ctr_exec_p99:.1} | {:.3} ({:.0}× faster) |",
            gateway_exec.ms(0.5),
            gateway_exec.ms(0.99),
            gateway_exec.ms(0.5) / ctr_exec_p50,
            ctr_exec_p50 / gateway_exec.ms(0.5)
        );
        println!(
            "| exec `true`, recorded, against not recorded ({execs}) | {:.2} | {:.2} | the same call with `record: false` | {:.2} | {:.2} | {:.2} |",
            gateway_exec.ms(0.5),
            gateway_exec.ms(0.99),
            unrecorded_exec.ms(0.5),
            unrecorded_exec.ms(0.99),
            gateway_exec.ms(0.5) / unrecorded_exec.ms(0.5)
        );
        for (what, ours, baseline) in [("pause", &mut pause, &mut ctr_pause), ("resume", &mut resume, &mut ctr_resume)] {
            println!(
                "| {what} through the gateway | {:.2} | {:.2} | `ctr task {what}` | {:.1} | {:.1} | {:.3} |",
                ours.ms(0.5),
                ours.ms(0.99),
                baseline.ms(0.5),
                baseline.ms(0.99),
                ours.ms(0.5) / baseline.ms(0.5)
            );
        }
        snapshots.print();
        terminals.print();
        previews.print();
        mcp.print();
        println!(
            "\ndensity: {reached} idle sandboxes started in {density_secs:.1} s; host memory per idle sandbox {per_sandbox_mib:.1} MiB (MemAvailable {} → {} MiB)",
            before / 1024,
            after / 1024
        );
        Ok::<(), anyhow::Error>(())
    })
}

/// Snapshot of a sandbox holding 100 MiB of random bytes, and a sandbox started from it,
/// against the same archive moved without snapshots: downloaded (`GET …/archive`), and
/// uploaded into a new cold sandbox (`PUT …/archive`).
struct SnapshotSamples {
    snapshot: Samples,
    restore: Samples,
    download: Samples,
    upload: Samples,
}

async fn snapshot_samples(api: &Api) -> SnapshotSamples {
    // Room for 100 MiB (and no warm sandbox has this size).
    let size = json!({ "disk_mb": 256 });
    let (_, id) = api.create_ready(json!({ "resources": size })).await;
    let command = "head -c 104857600 /dev/urandom > /work/big";
    let (status, result) = api
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "cmd": ["sh", "-c", command] }),
        )
        .await;
    assert_eq!((status, &result["exit_code"]), (200, &json!(0)), "{result}");
    let mut samples = SnapshotSamples {
        snapshot: Samples(Vec::new()),
        restore: Samples(Vec::new()),
        download: Samples(Vec::new()),
        upload: Samples(Vec::new()),
    };
    let cold = json!({ "resources": size });
    for _ in 0..5 {
        let started = Instant::now();
        let (status, snapshot) = api
            .post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}))
            .await;
        assert_eq!(status, 201, "{snapshot}");
        samples.snapshot.0.push(started.elapsed());
        let snapshot_id = snapshot["id"].as_str().expect("id").to_owned();
        let (elapsed, fork) = api
            .create_ready(json!({ "snapshot": snapshot_id, "resources": size }))
            .await;
        samples.restore.0.push(elapsed);
        api.delete(&format!("/v1/sandboxes/{fork}")).await;
        api.delete(&format!("/v1/snapshots/{snapshot_id}")).await;

        let started = Instant::now();
        let archive = api
            .http
            .get(format!("{}/v1/sandboxes/{id}/archive?path=/work", api.url))
            .bearer_auth(&api.token)
            .send()
            .await
            .expect("archive")
            .bytes()
            .await
            .expect("archive body");
        samples.download.0.push(started.elapsed());
        let started = Instant::now();
        let (_, other) = api.create_ready(cold.clone()).await;
        let uploaded = api
            .http
            .put(format!(
                "{}/v1/sandboxes/{other}/archive?path=/work",
                api.url
            ))
            .bearer_auth(&api.token)
            .body(archive)
            .send()
            .await
            .expect("upload");
        assert!(uploaded.status().is_success(), "{}", uploaded.status());
        samples.upload.0.push(started.elapsed());
        api.delete(&format!("/v1/sandboxes/{other}")).await;
    }
    api.delete(&format!("/v1/sandboxes/{id}")).await;
    samples
}

impl SnapshotSamples {
    fn print(mut self) {
        println!(
            "| snapshot of 100 MiB (5) | {:.0} | {:.0} | `GET …/archive` of /work | {:.0} | {:.0} | {:.2} |",
            self.snapshot.ms(0.5),
            self.snapshot.ms(0.99),
            self.download.ms(0.5),
            self.download.ms(0.99),
            self.snapshot.ms(0.5) / self.download.ms(0.5)
        );
        println!(
            "| create from it → first `true` (5) | {:.0} | {:.0} | cold create + `PUT …/archive` | {:.0} | {:.0} | {:.2} |",
            self.restore.ms(0.5),
            self.restore.ms(0.99),
            self.upload.ms(0.5),
            self.upload.ms(0.99),
            self.restore.ms(0.5) / self.upload.ms(0.5)
        );
    }
}
