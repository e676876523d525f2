//! Sandbox start and command latency against raw containerd, in the same run.
//!
//! - start: `Runtime::create` (copy-on-write snapshot of the template, container, task,
//!   agent listening) + one command + destroy, against `ctr run --rm` of the same busybox
//!   root file system running the same command (containerd's own client, its ~20 ms start-up
//!   included, as anyone timing `ctr` sees it).
//! - warm start: claiming a started sandbox from a warm pool + one command.
//! - exec: a command through the agent's socket, against `ctr task exec` into the same
//!   running sandbox.
//!
//! Needs what the worker tests need (root, scripts/setup's containerd, busybox-static, the
//! static agent in SANDBASE_AGENT_BINARY):
//! `SANDBASE_AGENT_BINARY=… cargo bench -p sandbase-worker --bench sandbox_lifecycle`.
//! BENCH_STARTS (20) and BENCH_EXECS (200) set the sample sizes.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sandbase_agent::protocol::{ExecRequest, Reply, Request, read_frame, write_json};
use sandbase_worker::gvisor::Isolation;
use sandbase_worker::pool::WarmPool;
use sandbase_worker::runtime::{Runtime, RuntimeConfig};
use sandbase_worker::spec::Limits;
use sandbase_worker::templates;

const LIMITS: Limits = Limits {
    cpu_millis: 1000,
    memory_mb: 256,
    disk_mb: 256,
    pids: 128,
};

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn socket_path() -> String {
    std::env::var("SANDBASE_CONTAINERD_SOCKET")
        .unwrap_or_else(|_| "/run/sandbase/containerd.sock".to_owned())
}

struct Samples(Vec<Duration>);

impl Samples {
    fn percentile(&mut self, fraction: f64) -> f64 {
        self.0.sort_unstable();
        let index = ((self.0.len() as f64 - 1.0) * fraction).round() as usize;
        self.0[index].as_secs_f64() * 1000.0
    }
}

/// Runs `true` through the agent and waits for its exit.
fn agent_exec(socket: &Path) -> Duration {
    let started = Instant::now();
    let mut stream = UnixStream::connect(socket).expect("connect to the agent");
    write_json(
        &mut stream,
        &Request::Exec(ExecRequest {
            argv: vec!["/bin/true".into()],
            ..Default::default()
        }),
    )
    .expect("send");
    loop {
        let frame = read_frame(&mut stream).expect("read").expect("a frame");
        if let Ok(Reply::Exit(exit)) = serde_json::from_slice::<Reply>(&frame.payload) {
            assert_eq!(exit.code, 0);
            return started.elapsed();
        }
    }
}

fn ctr(namespace: &str, args: &[&str]) -> Duration {
    let started = Instant::now();
    let output = Command::new("ctr")
        .args(["--address", &socket_path(), "-n", namespace])
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
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let starts = env_number("BENCH_STARTS", 20);
    let execs = env_number("BENCH_EXECS", 200);
    let unique = std::process::id();
    let namespace = format!("sandbase-bench-{unique}");
    let base = 3_000_000;
    let work = std::env::temp_dir().join(format!("sandbase-bench-{unique}"));
    let config = RuntimeConfig {
        containerd_socket: PathBuf::from(socket_path()),
        namespace: namespace.clone(),
        agent_binary: PathBuf::from(std::env::var("SANDBASE_AGENT_BINARY")?),
        run_dir: work.join("run"),
        id_base: base,
        runsc: sandbase_worker::gvisor::find_runsc(),
    };
    let (worker, _) = Runtime::start(config).await?;
    worker
        .containerd()
        .build_template("busybox", |rootfs| templates::busybox(rootfs, base))
        .await?;
    // The baseline's root file system: the same busybox, owned by root (no user namespace).
    let baseline_rootfs = work.join("baseline-rootfs");
    templates::busybox(&baseline_rootfs, 0)?;
    let baseline_rootfs = baseline_rootfs.to_str().expect("utf-8").to_owned();

    println!("{starts} starts and {execs} commands each; warming up");
    let warm = worker.create("busybox", LIMITS).await?;
    worker.destroy(&warm.id).await?;
    ctr(
        &namespace,
        &[
            "run",
            "--rm",
            "--rootfs",
            &baseline_rootfs,
            "warmup",
            "/bin/true",
        ],
    );

    let mut ours = Samples(Vec::new());
    let mut baseline = Samples(Vec::new());
    for index in 0..starts {
        let started = Instant::now();
        let sandbox = worker.create("busybox", LIMITS).await?;
        let socket = sandbox.socket.clone();
        tokio::task::spawn_blocking(move || agent_exec(&socket)).await?;
        worker.destroy(&sandbox.id).await?;
        ours.0.push(started.elapsed());
        let name = format!("baseline-{index}");
        baseline.0.push(ctr(
            &namespace,
            &[
                "run",
                "--rm",
                "--rootfs",
                &baseline_rootfs,
                &name,
                "/bin/true",
            ],
        ));
    }

    // Warm pool: each claim finds a started sandbox waiting (the pool refills between claims,
    // as it does between requests that are not simultaneous).
    let worker = std::sync::Arc::new(worker);
    let pool = WarmPool::start(worker.clone(), "busybox", LIMITS, 2);
    let mut warm = Samples(Vec::new());
    for _ in 0..starts {
        while pool.ready() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let started = Instant::now();
        let sandbox = pool.claim().await?;
        let socket = sandbox.socket.clone();
        tokio::task::spawn_blocking(move || agent_exec(&socket)).await?;
        warm.0.push(started.elapsed());
        worker.destroy(&sandbox.id).await?;
    }
    pool.close().await?;

    let sandbox = worker.create("busybox", LIMITS).await?;
    let socket = sandbox.socket.clone();
    let agent_execs = tokio::task::spawn_blocking(move || {
        Samples((0..execs).map(|_| agent_exec(&socket)).collect())
    })
    .await?;
    let mut agent_execs = agent_execs;
    let ctr_execs = (execs / 10).max(5);
    let mut ctr_exec = Samples(
        (0..ctr_execs)
            .map(|index| {
                ctr(
                    &namespace,
                    &[
                        "task",
                        "exec",
                        "--exec-id",
                        &format!("bench-{index}"),
                        &sandbox.id,
                        "/bin/true",
                    ],
                )
            })
            .collect(),
    );
    let paused = pause_samples(&worker, &namespace, &sandbox.id, execs / 4).await?;
    worker.destroy(&sandbox.id).await?;

    println!();
    println!(
        "| operation | SandBase p50 ms | p99 ms | baseline | baseline p50 ms | p99 ms | ratio (p50) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let start_ratio = ours.percentile(0.5) / baseline.percentile(0.5);
    println!(
        "| start + `true` + destroy | {:.1} | {:.1} | `ctr run --rm` | {:.1} | {:.1} | {:.2} |",
        ours.percentile(0.5),
        ours.percentile(0.99),
        baseline.percentile(0.5),
        baseline.percentile(0.99),
        start_ratio
    );
    println!(
        "| warm-pool claim + `true` (no destroy) | {:.2} | {:.2} | `ctr run --rm` | {:.1} | {:.1} | {:.3} |",
        warm.percentile(0.5),
        warm.percentile(0.99),
        baseline.percentile(0.5),
        baseline.percentile(0.99),
        warm.percentile(0.5) / baseline.percentile(0.5)
    );
    let exec_ratio = agent_execs.percentile(0.5) / ctr_exec.percentile(0.5);
    println!(
        "| exec `true` | {:.2} | {:.2} | `ctr task exec` | {:.1} | {:.1} | {:.3} |",
        agent_execs.percentile(0.5),
        agent_execs.percentile(0.99),
        ctr_exec.percentile(0.5),
        ctr_exec.percentile(0.99),
        exec_ratio
    );

    paused.print();

    if worker.isolations().contains(&Isolation::Gvisor) {
        gvisor_rows(&worker, &namespace, &baseline_rootfs, starts, execs).await?;
    }

    ctr(
        &namespace,
        &["snapshots", "rm", "sandbase/gvisor-template/busybox"],
    );
    ctr(
        &namespace,
        &["snapshots", "rm", "sandbase/template/busybox"],
    );
    sandbase_worker::runtime::remove_run_dir(&work.join("run"))?;
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// Pause and resume of a running sandbox (the same containerd calls the worker makes),
/// each followed by nothing; `ctr task pause|resume` of the same sandbox as the baseline.
struct PauseSamples {
    pause: Samples,
    resume: Samples,
    ctr_pause: Samples,
    ctr_resume: Samples,
}

async fn pause_samples(
    worker: &Runtime,
    namespace: &str,
    id: &str,
    rounds: usize,
) -> anyhow::Result<PauseSamples> {
    let mut samples = PauseSamples {
        pause: Samples(Vec::new()),
        resume: Samples(Vec::new()),
        ctr_pause: Samples(Vec::new()),
        ctr_resume: Samples(Vec::new()),
    };
    for _ in 0..rounds.max(10) {
        let started = Instant::now();
        worker.containerd().pause_task(id).await?;
        samples.pause.0.push(started.elapsed());
        let started = Instant::now();
        worker.containerd().resume_task(id).await?;
        samples.resume.0.push(started.elapsed());
        samples
            .ctr_pause
            .0
            .push(ctr(namespace, &["task", "pause", id]));
        samples
            .ctr_resume
            .0
            .push(ctr(namespace, &["task", "resume", id]));
    }
    Ok(samples)
}

impl PauseSamples {
    fn print(mut self) {
        for (what, ours, baseline) in [
            ("pause", &mut self.pause, &mut self.ctr_pause),
            ("resume", &mut self.resume, &mut self.ctr_resume),
        ] {
            println!(
                "| {what} | {:.2} | {:.2} | `ctr task {what}` | {:.1} | {:.1} | {:.3} |",
                ours.percentile(0.5),
                ours.percentile(0.99),
                baseline.percentile(0.5),
                baseline.percentile(0.99),
                ours.percentile(0.5) / baseline.percentile(0.5)
            );
        }
    }
}

/// The same start and exec under gVisor, against `ctr run` with the same runsc launcher.
async fn gvisor_rows(
    worker: &Runtime,
    namespace: &str,
    baseline_rootfs: &str,
    starts: usize,
    execs: usize,
) -> anyhow::Result<()> {
    let launcher = worker
        .config()
        .run_dir
        .join("bin")
        .join(sandbase_worker::gvisor::LAUNCHER);
    let launcher = launcher.to_str().expect("utf-8").to_owned();
    let create = || worker.create_with_volumes("busybox", LIMITS, Vec::new(), Isolation::Gvisor);
    // The template's gVisor copy is made by the first start.
    let first = create().await?;
    worker.destroy(&first.id).await?;
    let (mut ours, mut baseline) = (Samples(Vec::new()), Samples(Vec::new()));
    for index in 0..starts {
        let started = Instant::now();
        let sandbox = create().await?;
        let socket = sandbox.socket.clone();
        tokio::task::spawn_blocking(move || agent_exec(&socket)).await?;
        worker.destroy(&sandbox.id).await?;
        ours.0.push(started.elapsed());
        let name = format!("gvisor-baseline-{index}");
        baseline.0.push(ctr(
            namespace,
            &[
                "run",
                "--rm",
                "--runc-binary",
                &launcher,
                "--rootfs",
                baseline_rootfs,
                &name,
                "/bin/true",
            ],
        ));
    }
    let sandbox = create().await?;
    let socket = sandbox.socket.clone();
    let mut execs = tokio::task::spawn_blocking(move || {
        Samples((0..execs).map(|_| agent_exec(&socket)).collect())
    })
    .await?;
    worker.destroy(&sandbox.id).await?;
    println!(
        "| gVisor: start + `true` + destroy | {:.1} | {:.1} | `ctr run --rm` (runsc) | {:.1} | {:.1} | {:.2} |",
        ours.percentile(0.5),
        ours.percentile(0.99),
        baseline.percentile(0.5),
        baseline.percentile(0.99),
        ours.percentile(0.5) / baseline.percentile(0.5)
    );
    println!(
        "| gVisor: exec `true` | {:.2} | {:.2} | — | | | |",
        execs.percentile(0.5),
        execs.percentile(0.99),
    );
    Ok(())
}
