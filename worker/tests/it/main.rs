//! The sandbox spec, run for real: a busybox root file system, the statically linked
//! agent as PID 1, runc, and attempts to get out.
//!
//! Needs root, runc and busybox-static (scripts/setup installs them) and a static agent
//! (scripts/test builds it and sets SANDBASE_AGENT_BINARY).

#![allow(clippy::unwrap_used)] // Tests panic on purpose when an expectation fails.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sandbase_agent::protocol::{
    ExecRequest, ExitInfo, FrameKind, Owner, Reply, Request, read_frame, write_json,
};
use sandbase_worker::spec::{Limits, SANDBOX_USER, SandboxSpec, oci_spec};

struct Sandbox {
    id: String,
    dir: PathBuf,
    state: PathBuf,
    socket: PathBuf,
}

fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl Sandbox {
    fn start(limits: Limits) -> Sandbox {
        let agent = std::env::var("SANDBASE_AGENT_BINARY")
            .expect("SANDBASE_AGENT_BINARY: a statically linked agent (scripts/test builds it)");
        let unique = format!("{}-{}", std::process::id(), rand_suffix());
        let id = format!("sandbase-spec-{unique}");
        let dir = std::env::temp_dir().join(&id);
        let rootfs = dir.join("rootfs");
        // Each test its own id range: 65536 ids from 1_000_000 up.
        let base = 1_000_000 + (rand_suffix() % 1000) as u32 * 65_536;

        busybox_rootfs(&rootfs, base);

        // The agent's socket directory: the sandbox's root only.
        let control = dir.join("control");
        std::fs::create_dir_all(&control).unwrap();
        run(Command::new("chown")
            .arg(format!("{base}:{base}"))
            .arg(&control));
        run(Command::new("chmod").arg("700").arg(&control));

        let spec = oci_spec(&SandboxSpec {
            hostname: "sandbox".to_owned(),
            host_id_base: base,
            agent_binary: agent,
            control_dir: control.to_str().unwrap().to_owned(),
            resolv_conf: resolv_conf(&dir),
            network_namespace: None,
            volumes: Vec::new(),
            limits,
        });
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_vec_pretty(&spec).unwrap(),
        )
        .unwrap();
        // One runc state root for every test sandbox, outside the sandbox's own directory.
        let state = std::env::temp_dir().join("sandbase-spec-runc");
        // The container inherits runc's standard streams: a log file, not pipes that would
        // stay open as long as the agent runs.
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let status = Command::new("runc")
            .arg("--root")
            .arg(&state)
            .args(["run", "--detach", "--bundle"])
            .arg(&dir)
            .arg(&id)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "runc run failed: {}",
            std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
        );
        let socket = control.join("agent.sock");
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the agent did not come up in the container"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Sandbox {
            id,
            dir,
            state,
            socket,
        }
    }

    /// Runs `script` with sh as the sandbox user (or root of the sandbox).
    fn sh(&self, script: &str, as_root: bool) -> (String, String, ExitInfo) {
        agent_sh(&self.socket, script, as_root)
    }

    /// Runs as the sandbox user and expects failure.
    #[track_caller]
    fn refused(&self, script: &str) {
        let (stdout, stderr, exit) = self.sh(script, false);
        assert_ne!(exit.code, 0, "`{script}` succeeded: {stdout}{stderr}");
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&self.state)
            .args(["kill", &self.id, "KILL"])
            .output();
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&self.state)
            .args(["delete", "--force", &self.id])
            .output();
        if std::thread::panicking() {
            eprintln!(
                "agent log of the failed sandbox:\n{}",
                std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
            );
        }
        if let Err(error) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("removing {}: {error}", self.dir.display());
        }
    }
}

/// A busybox root file system owned by the sandbox's root (host ids from `base`).
fn busybox_rootfs(rootfs: &Path, base: u32) {
    sandbase_worker::templates::busybox(rootfs, base).unwrap();
}

/// The agent's socket directory: the sandbox's root only.
fn control_dir(path: &Path, base: u32) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    run(Command::new("chown")
        .arg(format!("{base}:{base}"))
        .arg(path));
    run(Command::new("chmod").arg("700").arg(path));
    path.to_path_buf()
}

/// Runs `script` with sh through the agent at `socket`, as the sandbox user or its root.
fn agent_sh(socket: &Path, script: &str, as_root: bool) -> (String, String, ExitInfo) {
    let mut stream = UnixStream::connect(socket).unwrap();
    write_json(
        &mut stream,
        &Request::Exec(ExecRequest {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            user: (!as_root).then_some(Owner {
                uid: SANDBOX_USER,
                gid: SANDBOX_USER,
            }),
            cwd: Some("/tmp".into()),
            timeout_ms: Some(20_000),
            ..Default::default()
        }),
    )
    .unwrap();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        let frame = read_frame(&mut stream).unwrap().expect("frame");
        match frame.kind {
            FrameKind::Stdout => stdout.extend(frame.payload),
            FrameKind::Stderr => stderr.extend(frame.payload),
            FrameKind::Json => match serde_json::from_slice::<Reply>(&frame.payload).unwrap() {
                Reply::Started { .. } => {}
                Reply::Exit(exit) => {
                    return (
                        String::from_utf8_lossy(&stdout).into(),
                        String::from_utf8_lossy(&stderr).into(),
                        exit,
                    );
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }
}

fn wait_for_socket(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "the agent did not come up in the container"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    hasher.finish() % 1_000_000
}

const LIMITS: Limits = Limits {
    cpu_millis: 1000,
    memory_mb: 128,
    disk_mb: 64,
    pids: 64,
};

#[test]
fn the_agent_is_pid_one_and_commands_run_unprivileged() {
    let sandbox = Sandbox::start(LIMITS);
    let (stdout, _, exit) = sandbox.sh(
        "id -u; id -g; cat /proc/1/cmdline | tr '\\0' ' '; echo; hostname",
        false,
    );
    assert_eq!(exit.code, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "1000");
    assert_eq!(lines[1], "1000");
    assert!(
        lines[2].starts_with("/.sandbase/agent --socket"),
        "{stdout}"
    );
    assert_eq!(lines[3], "sandbox");
    // Even the sandbox's root is an unprivileged id on the host.
    let (stdout, _, _) = sandbox.sh("cat /proc/self/uid_map", true);
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(fields[0], "0");
    assert_ne!(fields[1], "0");
    let (stdout, _, _) = sandbox.sh(
        "grep -E '^(NoNewPrivs|Seccomp|CapEff)' /proc/self/status",
        false,
    );
    assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
    assert!(stdout.contains("Seccomp:\t2"), "{stdout}");
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{stdout}");
}

#[test]
fn escape_attempts_fail_and_the_sandbox_keeps_working() {
    let sandbox = Sandbox::start(LIMITS);
    // The agent's control socket is out of reach of user commands.
    sandbox.refused("ls /.sandbase/run");
    sandbox.refused("echo x > /.sandbase/agent");
    // Mounting, new namespaces, kernel tunables, raw devices, kernel memory.
    sandbox.refused("mount -t tmpfs none /mnt");
    sandbox.refused("unshare -r true");
    sandbox.refused("echo 1 > /proc/sys/kernel/sysrq");
    sandbox.refused("mknod /tmp/sda b 8 0");
    sandbox.refused("head -c 16 /proc/kcore > /tmp/kcore && test -s /tmp/kcore");
    sandbox.refused("echo hi > /etc/passwd");
    // Not even the sandbox's root may mount or reach kernel state.
    let (_, _, exit) = sandbox.sh("mount -t tmpfs none /mnt", true);
    assert_ne!(exit.code, 0);
    let (_, _, exit) = sandbox.sh("echo 1 > /proc/sysrq-trigger", true);
    assert_ne!(exit.code, 0);
    // Still serving.
    let (stdout, _, exit) = sandbox.sh("echo alive", false);
    assert_eq!((stdout.as_str(), exit.code), ("alive\n", 0));
    // The OOM killer picks a command before the agent (the agent raises the score just
    // after the spawn, so the command reads it a moment later).
    let (stdout, _, _) = sandbox.sh(
        "sleep 0.3; cat /proc/1/oom_score_adj /proc/self/oom_score_adj",
        true,
    );
    let scores: Vec<i32> = stdout.lines().map(|line| line.parse().unwrap()).collect();
    assert!(
        scores[1] >= scores[0] + 500,
        "agent {}, command {}",
        scores[0],
        scores[1]
    );
}

#[test]
fn limits_hold_against_exhaustion() {
    let sandbox = Sandbox::start(LIMITS);
    // More processes than the pids limit: the fork bomb is contained.
    let (stdout, _, _) = sandbox.sh("for i in $(seq 1 100); do sleep 5 & done 2>/dev/null; sleep 0.2; ls /proc | grep -c '^[0-9]'", false);
    let processes: u32 = stdout.trim().parse().unwrap_or(0);
    assert!(
        processes <= LIMITS.pids,
        "{processes} processes under a limit of {}",
        LIMITS.pids
    );
    sandbox.sh("kill -9 -1 2>/dev/null; true", false);
    // Memory beyond the limit kills the hog, not the sandbox.
    let (stdout, _, exit) = sandbox.sh(
        "awk 'BEGIN { s = \"x\"; for (i = 0; i < 40; i++) s = s s; print length(s) }'",
        false,
    );
    assert_ne!(
        exit.code, 0,
        "a 1 TiB string under a 128 MiB limit: {stdout}"
    );
    // Writing past the disk cap fails with ENOSPC, in /work and in /tmp; the root is read-only.
    let (_, stderr, exit) = sandbox.sh("dd if=/dev/zero of=/work/fill bs=1M count=100", false);
    assert_ne!(exit.code, 0);
    assert!(stderr.contains("No space left"), "{stderr}");
    let (stdout, _, _) = sandbox.sh("du -m /work/fill | cut -f1", false);
    assert!(stdout.trim().parse::<u32>().unwrap() <= LIMITS.disk_mb);
    let (_, stderr, exit) = sandbox.sh("dd if=/dev/zero of=/tmp/fill bs=1M count=100", false);
    assert_ne!(exit.code, 0);
    assert!(stderr.contains("No space left"), "{stderr}");
    sandbox.refused("echo x > /etc/motd");
    sandbox.refused("echo x > /fill");
    sandbox.sh("rm -f /work/fill /tmp/fill", false);
    let (stdout, _, exit) = sandbox.sh("echo kept > /work/small && cat /work/small", false);
    assert_eq!(
        (stdout.as_str(), exit.code),
        (
            "kept
", 0
        )
    );
    let (stdout, _, exit) = sandbox.sh("echo alive", false);
    assert_eq!((stdout.as_str(), exit.code), ("alive\n", 0));
}

#[test]
fn nothing_is_left_after_destroy() {
    let sandbox = Sandbox::start(LIMITS);
    let (id, state, dir) = (
        sandbox.id.clone(),
        sandbox.state.clone(),
        sandbox.dir.clone(),
    );
    drop(sandbox);
    let listed = Command::new("runc")
        .arg("--root")
        .arg(&state)
        .arg("list")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&listed.stdout).contains(&id));
    assert!(!Path::new(&dir).exists());
    let cgroups = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "find /sys/fs/cgroup -maxdepth 3 -name '*{id}*' | head -1"
        ))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&cgroups.stdout).trim().is_empty(),
        "cgroup left behind"
    );
}

/// The same sandbox through containerd: a template snapshot, a container and task on a
/// copy-on-write snapshot of it, commands through the agent, and a destroy that leaves
/// no container, task, snapshot or cgroup behind.
#[tokio::test(flavor = "multi_thread")]
async fn containerd_runs_a_sandbox_and_destroy_removes_every_trace() {
    use sandbase_worker::containerd::Containerd;

    let socket = std::env::var("SANDBASE_CONTAINERD_SOCKET")
        .unwrap_or_else(|_| "/run/sandbase/containerd.sock".to_owned());
    let namespace = format!("sandbase-test-{}", rand_suffix());
    let client = Containerd::connect(Path::new(&socket), &namespace)
        .await
        .unwrap();
    let base = 1_000_000 + (rand_suffix() % 1000) as u32 * 65_536;
    let template = "busybox";
    assert!(!client.template_exists(template).await.unwrap());
    client
        .build_template(template, |rootfs| {
            busybox_rootfs(rootfs, base);
            Ok(())
        })
        .await
        .unwrap();
    assert!(client.template_exists(template).await.unwrap());

    let id = format!("sandbox-{}", rand_suffix());
    let work = std::env::temp_dir().join(format!("sandbase-containerd-{id}"));
    let control = control_dir(&work.join("control"), base);
    let spec = oci_spec(&SandboxSpec {
        hostname: "sandbox".to_owned(),
        host_id_base: base,
        agent_binary: std::env::var("SANDBASE_AGENT_BINARY").expect("SANDBASE_AGENT_BINARY"),
        control_dir: control.to_str().unwrap().to_owned(),
        resolv_conf: resolv_conf(&work),
        network_namespace: None,
        volumes: Vec::new(),
        limits: LIMITS,
    });
    client.start_sandbox(&id, template, &spec).await.unwrap();
    let socket = control.join("agent.sock");
    tokio::task::spawn_blocking({
        let socket = socket.clone();
        move || {
            wait_for_socket(&socket);
            let (stdout, _, exit) = agent_sh(
                &socket,
                "id -u; echo data > /work/file; cat /work/file",
                false,
            );
            assert_eq!((stdout.as_str(), exit.code), ("1000\ndata\n", 0));
            // The root file system is read-only, even to the sandbox's root.
            let (_, _, exit) = agent_sh(&socket, "rm /bin/busybox", true);
            assert_ne!(exit.code, 0);
        }
    })
    .await
    .unwrap();

    client.destroy_sandbox(&id).await.unwrap();
    // Destroying again is a no-op, not an error.
    client.destroy_sandbox(&id).await.unwrap();
    let ctr = |what: &str| {
        run(Command::new("ctr").args(["--address", &socket_path(), "-n", &namespace, what, "ls"]))
    };
    for what in ["containers", "tasks", "snapshots"] {
        let listing = ctr(what);
        assert!(!listing.contains(&id), "{what} left behind: {listing}");
    }
    let cgroups = run(Command::new("sh").arg("-c").arg(format!(
        "find /sys/fs/cgroup -maxdepth 4 -name '*{id}*' 2>/dev/null; true"
    )));
    assert!(cgroups.trim().is_empty(), "cgroups left behind: {cgroups}");

    // A second sandbox from the same template still has its busybox.
    let second = format!("{id}-2");
    client
        .start_sandbox(&second, template, &spec)
        .await
        .unwrap();
    tokio::task::spawn_blocking(move || {
        wait_for_socket(&socket);
        let (stdout, _, _) = agent_sh(&socket, "ls /bin/busybox", false);
        assert_eq!(stdout, "/bin/busybox\n");
    })
    .await
    .unwrap();
    client.destroy_sandbox(&second).await.unwrap();
    run(Command::new("ctr").args([
        "--address",
        &socket_path(),
        "-n",
        &namespace,
        "snapshots",
        "rm",
        "sandbase/template/busybox",
    ]));
    client.remove_namespace().await.unwrap();
    std::fs::remove_dir_all(&work).unwrap();
}

/// A worker of its own: a fresh containerd namespace, run directory and id range.
fn worker_config() -> sandbase_worker::runtime::RuntimeConfig {
    let unique = rand_suffix();
    sandbase_worker::runtime::RuntimeConfig {
        containerd_socket: PathBuf::from(socket_path()),
        namespace: format!("sandbase-test-{unique}"),
        agent_binary: PathBuf::from(
            std::env::var("SANDBASE_AGENT_BINARY").expect("SANDBASE_AGENT_BINARY"),
        ),
        run_dir: std::env::temp_dir().join(format!("sandbase-worker-run-{unique}")),
        id_base: 1_000_000 + (unique % 1000) as u32 * 65_536,
    }
}

/// Removes a test worker's template snapshot and run directory (its sandboxes are gone).
fn clean_up(config: &sandbase_worker::runtime::RuntimeConfig, template: &str) {
    run(Command::new("ctr").args([
        "--address",
        &socket_path(),
        "-n",
        &config.namespace,
        "snapshots",
        "rm",
        &format!("sandbase/template/{template}"),
    ]));
    run(Command::new("ctr").args([
        "--address",
        &socket_path(),
        "namespaces",
        "rm",
        &config.namespace,
    ]));
    std::fs::remove_dir_all(&config.run_dir).unwrap();
}

fn socket_path() -> String {
    std::env::var("SANDBASE_CONTAINERD_SOCKET")
        .unwrap_or_else(|_| "/run/sandbase/containerd.sock".to_owned())
}

/// A worker that crashed leaves sandboxes running; the next one to start removes them all.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_worker_removes_what_the_previous_one_left() {
    use sandbase_worker::runtime::Runtime;

    let config = worker_config();
    let (base, run_dir) = (config.id_base, config.run_dir.clone());
    let (worker, removed) = Runtime::start(config.clone()).await.unwrap();
    assert_eq!(removed, 0);
    worker
        .containerd()
        .build_template("busybox", |rootfs| {
            busybox_rootfs(rootfs, base);
            Ok(())
        })
        .await
        .unwrap();
    let first = worker.create("busybox", LIMITS).await.unwrap();
    let second = worker.create("busybox", LIMITS).await.unwrap();
    let sockets = [first.socket.clone(), second.socket.clone()];
    tokio::task::spawn_blocking(move || {
        for socket in sockets {
            let (stdout, _, _) = agent_sh(&socket, "echo up", false);
            assert_eq!(stdout, "up\n");
        }
    })
    .await
    .unwrap();

    // The worker goes away without destroying anything, as in a crash.
    drop(worker);
    let (worker, removed) = Runtime::start(config).await.unwrap();
    assert_eq!(removed, 2);
    assert!(worker.containerd().sandbox_ids().await.unwrap().is_empty());
    assert!(
        worker
            .containerd()
            .sandbox_snapshots()
            .await
            .unwrap()
            .is_empty()
    );
    assert!(!first.socket.parent().unwrap().exists());

    // A sandbox that cannot start leaves nothing either.
    assert!(worker.create("no-such-template", LIMITS).await.is_err());
    assert!(worker.containerd().sandbox_ids().await.unwrap().is_empty());
    assert!(
        worker
            .containerd()
            .sandbox_snapshots()
            .await
            .unwrap()
            .is_empty()
    );
    // Nothing of a sandbox (the worker's own resolver file stays).
    let left: Vec<String> = std::fs::read_dir(&run_dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "resolv.conf")
        .collect();
    assert!(left.is_empty(), "{left:?}");

    clean_up(worker.config(), "busybox");
}

/// Creating from a warm pool is a claim; the pool refills, and closing it leaves only what
/// was claimed.
#[tokio::test(flavor = "multi_thread")]
async fn a_warm_pool_hands_out_started_sandboxes_and_refills() {
    use sandbase_worker::pool::WarmPool;
    use sandbase_worker::runtime::Runtime;

    let config = worker_config();
    let base = config.id_base;
    let (worker, _) = Runtime::start(config.clone()).await.unwrap();
    worker
        .containerd()
        .build_template("busybox", |rootfs| {
            sandbase_worker::templates::busybox(rootfs, base)
        })
        .await
        .unwrap();
    let worker = std::sync::Arc::new(worker);
    let pool = WarmPool::start(worker.clone(), "busybox", LIMITS, 2);
    let wait_ready = |want: usize| {
        let pool = pool.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while pool.ready() < want {
                assert!(Instant::now() < deadline, "the pool did not fill");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_ready(2).await;

    // Three claims: two waiting, one started on the spot; all work, none shared.
    let mut claimed = Vec::new();
    for _ in 0..3 {
        claimed.push(pool.claim().await.unwrap());
    }
    let ids: std::collections::HashSet<_> =
        claimed.iter().map(|sandbox| sandbox.id.clone()).collect();
    assert_eq!(ids.len(), 3);
    let sockets: Vec<PathBuf> = claimed
        .iter()
        .map(|sandbox| sandbox.socket.clone())
        .collect();
    tokio::task::spawn_blocking(move || {
        for socket in sockets {
            assert_eq!(agent_sh(&socket, "echo ready", false).0, "ready\n");
        }
    })
    .await
    .unwrap();
    wait_ready(2).await;

    // Closing destroys the two waiting; the three claimed stay until their owner destroys them.
    pool.close().await.unwrap();
    assert_eq!(worker.containerd().sandbox_ids().await.unwrap().len(), 3);
    for sandbox in &claimed {
        worker.destroy(&sandbox.id).await.unwrap();
    }
    assert!(worker.containerd().sandbox_ids().await.unwrap().is_empty());
    assert!(
        worker
            .containerd()
            .sandbox_snapshots()
            .await
            .unwrap()
            .is_empty()
    );
    clean_up(worker.config(), "busybox");
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
/// The worker's asynchronous agent client against a real sandbox: streamed output in order,
/// standard input, files owned by the sandbox user, refusals with their kind.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_client_streams_commands_and_moves_files() {
    use sandbase_agent::protocol::{ExecRequest, Owner};
    use sandbase_worker::agent_client::{AgentClient, ExecEvent, Refused};
    use sandbase_worker::runtime::Runtime;

    let config = worker_config();
    let base = config.id_base;
    let (worker, _) = Runtime::start(config.clone()).await.unwrap();
    worker
        .containerd()
        .build_template("busybox", |rootfs| {
            sandbase_worker::templates::busybox(rootfs, base)
        })
        .await
        .unwrap();
    let sandbox = worker.create("busybox", LIMITS).await.unwrap();
    let agent = AgentClient::new(sandbox.socket.clone());
    let user = Some(Owner {
        uid: SANDBOX_USER,
        gid: SANDBOX_USER,
    });

    // Output arrives as it is produced, before the exit.
    let mut events = agent
        .exec(
            ExecRequest {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "echo one; sleep 0.3; echo two >&2; exit 7".into(),
                ],
                user,
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(event) = events.recv().await {
        seen.push(event.unwrap());
    }
    assert!(matches!(seen[0], ExecEvent::Started { .. }));
    assert_eq!(seen[1], ExecEvent::Stdout(b"one\n".to_vec()));
    assert_eq!(seen[2], ExecEvent::Stderr(b"two\n".to_vec()));
    assert!(matches!(seen[3], ExecEvent::Exit(exit) if exit.code == 7));

    // Standard input in, files through the agent, owned by the user.
    let (stdout, _, exit) = agent
        .run(
            ExecRequest {
                argv: vec!["wc".into(), "-c".into()],
                user,
                ..Default::default()
            },
            Some(vec![b'x'; 100_000]),
        )
        .await
        .unwrap();
    assert_eq!(
        (String::from_utf8(stdout).unwrap().trim(), exit.code),
        ("100000", 0)
    );
    let stat = agent
        .write_file("/work/dir/data.bin", &[7u8; 300_000], Some(0o600), user)
        .await
        .unwrap();
    assert_eq!(
        (stat.size, stat.uid, stat.mode),
        (300_000, SANDBOX_USER, 0o600)
    );
    let (_, content) = agent
        .read_file("/work/dir/data.bin", 1 << 20)
        .await
        .unwrap();
    assert_eq!(content, vec![7u8; 300_000]);
    let (stdout, _, _) = agent
        .run(
            ExecRequest {
                argv: vec!["cat".into(), "/work/dir/data.bin".into()],
                user,
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        stdout.len(),
        300_000,
        "the sandbox user can read what was written for it"
    );
    let listing = agent.list("/work/dir").await.unwrap();
    assert_eq!(
        listing
            .iter()
            .map(|entry| entry.name.as_str())
            .collect::<Vec<_>>(),
        ["data.bin"]
    );
    assert!(
        agent.read_file("/work/dir/data.bin", 1000).await.is_err(),
        "the size cap holds"
    );

    let missing = agent.read_file("/nope", 1000).await.unwrap_err();
    assert_eq!(
        missing.downcast_ref::<Refused>().unwrap().0.kind,
        "not_found"
    );
    let mut events = agent
        .exec(
            ExecRequest {
                argv: vec!["no-such-command".into()],
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    let refused = events.recv().await.unwrap().unwrap_err();
    assert_eq!(
        refused.downcast_ref::<Refused>().unwrap().0.kind,
        "not_found"
    );

    // The sandbox's root swaps its agent socket for a link to a host socket: a plain connect
    // from the worker would land on the host's containerd; the client refuses.
    let (_, _, exit) = agent
        .run(
            ExecRequest {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    format!(
                        "rm /.sandbase/run/agent.sock && ln -s {} /.sandbase/run/agent.sock",
                        socket_path()
                    ),
                ],
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(exit.code, 0);
    assert!(
        std::os::unix::net::UnixStream::connect(&sandbox.socket).is_ok(),
        "the link leads to the host's containerd: the attack is real"
    );
    let error = agent
        .simple(&sandbase_agent::protocol::Request::Ping)
        .await
        .unwrap_err();
    assert!(
        format!("{error:#}").contains("refusing to connect"),
        "{error:#}"
    );

    worker.destroy(&sandbox.id).await.unwrap();
    clean_up(worker.config(), "busybox");
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
/// The Debian `base` template (built by scripts/setup with mmdebstrap): the tools an agent
/// expects, run as the unprivileged user.
#[tokio::test(flavor = "multi_thread")]
async fn the_base_template_runs_python_pip_git_and_curl_as_the_user() {
    use sandbase_agent::protocol::{ExecRequest, Owner};
    use sandbase_worker::agent_client::AgentClient;
    use sandbase_worker::runtime::Runtime;

    let tarball = PathBuf::from(
        std::env::var("SANDBASE_BASE_TARBALL")
            .expect("SANDBASE_BASE_TARBALL: the base root file system (scripts/setup builds it)"),
    );
    let config = worker_config();
    let base = config.id_base;
    let (worker, _) = Runtime::start(config.clone()).await.unwrap();
    worker
        .containerd()
        .build_template("base", |rootfs| {
            sandbase_worker::templates::from_tarball(rootfs, &tarball, base)
        })
        .await
        .unwrap();
    let sandbox = worker.create("base", LIMITS).await.unwrap();
    let agent = AgentClient::new(sandbox.socket.clone());
    let script = "set -e; id -un; python3 -c 'print(6 * 7)'; pip3 --version | cut -d' ' -f1; \
                  git --version | cut -d' ' -f1-2; curl --version | head -1 | cut -d' ' -f1; \
                  test -s /etc/ssl/certs/ca-certificates.crt && echo certs; \
                  cd ~ && git init -q repo && echo repo; ls -ld /usr/bin/passwd | cut -c1-10";
    let (stdout, stderr, exit) = agent
        .run(
            ExecRequest {
                argv: vec!["bash".into(), "-lc".into(), script.into()],
                user: Some(Owner {
                    uid: SANDBOX_USER,
                    gid: SANDBOX_USER,
                }),
                env: [("HOME".to_owned(), "/work".to_owned())].into(),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    let stdout = String::from_utf8(stdout).unwrap();
    assert_eq!(exit.code, 0, "{stdout}{}", String::from_utf8_lossy(&stderr));
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "user",
            "42",
            "pip",
            "git version",
            "curl",
            "certs",
            "repo",
            "-rwsr-xr-x"
        ],
        "set-uid bits survive the id shift (and no_new_privs makes them inert)"
    );
    // New namespaces through clone(2) are refused too (unshare(2) is denied by name), as the
    // user and as the sandbox's root; threads and processes still start.
    for root in [false, true] {
        let probe = "import ctypes, os, threading\n\
                     libc = ctypes.CDLL(None, use_errno=True)\n\
                     r = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n\
                     if r == 0: os._exit(0)\n\
                     print(r, ctypes.get_errno())\n\
                     print('ptrace', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n\
                     t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
                     pid = os.fork()\n\
                     if pid == 0: os._exit(0)\n\
                     os.waitpid(pid, 0)\n\
                     print('fork ok')";
        let (stdout, stderr, exit) = agent
            .run(
                ExecRequest {
                    argv: vec!["python3".into(), "-c".into(), probe.into()],
                    user: (!root).then_some(Owner {
                        uid: SANDBOX_USER,
                        gid: SANDBOX_USER,
                    }),
                    ..Default::default()
                },
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            (String::from_utf8_lossy(&stdout).as_ref(), exit.code),
            ("-1 1\nptrace -1 1\nfork ok\n", 0),
            "root={root}: {}",
            String::from_utf8_lossy(&stderr)
        );
    }
    // And a set-uid program gives the user nothing.
    let (stdout, _, _) = agent
        .run(
            ExecRequest {
                argv: vec![
                    "bash".into(),
                    "-c".into(),
                    "su -c id root </dev/null 2>&1; id -u".into(),
                ],
                user: Some(Owner {
                    uid: SANDBOX_USER,
                    gid: SANDBOX_USER,
                }),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    assert!(
        String::from_utf8(stdout)
            .unwrap()
            .trim_end()
            .ends_with("1000")
    );

    worker.destroy(&sandbox.id).await.unwrap();
    clean_up(worker.config(), "base");
}

/// The resolver configuration every sandbox gets, written into `dir`.
fn resolv_conf(dir: &std::path::Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("resolv.conf");
    std::fs::write(&path, sandbase_worker::spec::RESOLV_CONF).unwrap();
    path.to_str().unwrap().to_owned()
}
