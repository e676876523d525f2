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
use sandbase_worker::gvisor::{Isolation, write_launcher};
use sandbase_worker::spec::{Limits, SANDBOX_USER, SandboxSpec, oci_spec};

struct Sandbox {
    /// runc, or the worker's runsc launcher.
    runtime: PathBuf,
    id: String,
    dir: PathBuf,
    state: PathBuf,
    socket: PathBuf,
}

mod containerd;

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

/// Every isolation level: each test runs its attacks against all of them.
const ISOLATIONS: [Isolation; 2] = [Isolation::Runc, Isolation::Gvisor];

/// The OCI runtime binary for `isolation`: runc, or the worker's launcher for runsc
/// (written once per test process).
fn runtime_binary(isolation: Isolation) -> PathBuf {
    match isolation {
        Isolation::Runc => PathBuf::from("runc"),
        Isolation::Gvisor => {
            static LAUNCHER: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
            LAUNCHER
                .get_or_init(|| {
                    let runsc = sandbase_worker::gvisor::find_runsc()
                        .expect("runsc (gVisor) on the PATH: scripts/setup installs it");
                    let dir = std::env::temp_dir()
                        .join(format!("sandbase-spec-launcher-{}", std::process::id()));
                    std::fs::create_dir_all(&dir).unwrap();
                    write_launcher(&dir, &runsc).unwrap()
                })
                .clone()
        }
    }
}

impl Sandbox {
    fn start(isolation: Isolation, limits: Limits) -> Sandbox {
        let agent = std::env::var("SANDBASE_AGENT_BINARY")
            .expect("SANDBASE_AGENT_BINARY: a statically linked agent (scripts/test builds it)");
        let unique = format!("{}-{}", std::process::id(), rand_suffix());
        let id = format!("sandbase-spec-{unique}");
        let dir = std::env::temp_dir().join(&id);
        let rootfs = dir.join("rootfs");
        // Each test its own id range: 65536 ids from 1_000_000 up.
        let base = 1_000_000 + (rand_suffix() % 1000) as u32 * 65_536;
        // Under gVisor the files keep their own ids (the worker's unshifted template copy).
        let owner = match isolation {
            Isolation::Runc => base,
            Isolation::Gvisor => 0,
        };

        busybox_rootfs(&rootfs, owner);

        // The agent's socket directory: the sandbox's root only.
        let control = dir.join("control");
        std::fs::create_dir_all(&control).unwrap();
        run(Command::new("chown")
            .arg(format!("{owner}:{owner}"))
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
            isolation,
        });
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_vec_pretty(&spec).unwrap(),
        )
        .unwrap();
        // One state root per runtime for every test sandbox, outside the sandbox's own
        // directory.
        let state = std::env::temp_dir().join(format!("sandbase-spec-{}", isolation.as_str()));
        let runtime = runtime_binary(isolation);
        // The container inherits runc's standard streams: a log file, not pipes that would
        // stay open as long as the agent runs.
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let status = Command::new(&runtime)
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
            "{isolation:?}: run failed: {}",
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
            runtime,
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

    /// The host process the runtime reports for the sandbox (under gVisor, the Sentry).
    fn host_pid(&self) -> u32 {
        let state = run(Command::new(&self.runtime)
            .arg("--root")
            .arg(&self.state)
            .args(["state", &self.id]));
        let state: serde_json::Value = serde_json::from_str(&state).unwrap();
        u32::try_from(state["pid"].as_u64().unwrap()).unwrap()
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
        let _ = Command::new(&self.runtime)
            .arg("--root")
            .arg(&self.state)
            .args(["kill", &self.id, "KILL"])
            .output();
        let _ = Command::new(&self.runtime)
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
    for isolation in ISOLATIONS {
        the_agent_is_pid_one_and_commands_run_unprivileged_under(isolation);
    }
}

fn the_agent_is_pid_one_and_commands_run_unprivileged_under(isolation: Isolation) {
    let sandbox = Sandbox::start(isolation, LIMITS);
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
    let (stdout, _, _) = sandbox.sh(
        "grep -E '^(NoNewPrivs|Seccomp|CapEff)' /proc/self/status",
        false,
    );
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{stdout}");
    match isolation {
        Isolation::Runc => {
            assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
            // Even the sandbox's root is an unprivileged id on the host, and every call
            // passes the allow-list.
            let (uid_map, _, _) = sandbox.sh("cat /proc/self/uid_map", true);
            let fields: Vec<&str> = uid_map.split_whitespace().collect();
            assert_eq!(fields[0], "0");
            assert_ne!(fields[1], "0");
            assert!(stdout.contains("Seccomp:\t2"), "{stdout}");
        }
        Isolation::Gvisor => {
            // Commands meet gVisor's kernel, not the host's ...
            let (dmesg, _, _) = sandbox.sh("dmesg | head -3", false);
            assert!(dmesg.contains("gVisor"), "{dmesg}");
            // ... whose host process is itself confined: a seccomp filter of its own, no
            // full capability set, and a root of its own.
            let pid = sandbox.host_pid();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            assert!(status.contains("Seccomp:\t2"), "{status}");
            assert!(!status.contains("CapEff:\t000001ffffffffff"), "{status}");
            // Its root is an empty directory: none of the host's files are there.
            assert!(Path::new("/etc/passwd").exists());
            assert!(!Path::new(&format!("/proc/{pid}/root/etc/passwd")).exists());
        }
    }
}

#[test]
fn escape_attempts_fail_and_the_sandbox_keeps_working() {
    for isolation in ISOLATIONS {
        escape_attempts_fail_and_the_sandbox_keeps_working_under(isolation);
    }
}

fn escape_attempts_fail_and_the_sandbox_keeps_working_under(isolation: Isolation) {
    let sandbox = Sandbox::start(isolation, LIMITS);
    // The agent's control socket is out of reach of user commands.
    sandbox.refused("ls /.sandbase/run");
    sandbox.refused("echo x > /.sandbase/agent");
    // Mounting, new namespaces, kernel tunables, raw devices, kernel memory.
    sandbox.refused("mount -t tmpfs none /mnt");
    sandbox.refused("unshare -r true");
    sandbox.refused("echo 1 > /proc/sys/kernel/sysrq");
    sandbox.refused("mknod /tmp/sda b 8 0 && head -c 512 /tmp/sda > /tmp/mbr && test -s /tmp/mbr");
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
    for isolation in ISOLATIONS {
        limits_hold_against_exhaustion_under(isolation);
    }
}

fn limits_hold_against_exhaustion_under(isolation: Isolation) {
    let sandbox = Sandbox::start(isolation, LIMITS);
    // More processes than the pids limit: the fork bomb is contained.
    let (stdout, _, _) = sandbox.sh("for i in $(seq 1 100); do sleep 5 & done 2>/dev/null; sleep 0.2; ls /proc | grep -c '^[0-9]'", false);
    let processes: u32 = stdout.trim().parse().unwrap_or(0);
    assert!(
        processes <= LIMITS.pids,
        "{processes} processes under a limit of {}",
        LIMITS.pids
    );
    sandbox.sh("kill -9 -1 2>/dev/null; true", false);
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
    // Memory beyond the limit: a 1 TiB string under a 128 MiB limit.
    let hog = "awk 'BEGIN { s = \"x\"; for (i = 0; i < 40; i++) s = s s; print length(s) }'";
    match isolation {
        // The host's OOM killer takes the hog, not the sandbox.
        Isolation::Runc => {
            let (stdout, _, exit) = sandbox.sh(hog, false);
            assert_ne!(exit.code, 0, "{stdout}");
            let (stdout, _, exit) = sandbox.sh("echo alive", false);
            assert_eq!((stdout.as_str(), exit.code), ("alive\n", 0));
        }
        // gVisor's Sentry holds all of the sandbox's memory, so the cgroup's OOM killer
        // ends the whole sandbox: the hog never gets its memory, and the node and the next
        // sandbox are unaffected.
        Isolation::Gvisor => {
            let survived = agent_sh_or_gone(&sandbox.socket, hog);
            assert!(
                survived.is_none_or(|exit| exit.code != 0),
                "the hog finished: {survived:?}"
            );
            let next = Sandbox::start(isolation, LIMITS);
            let (stdout, _, exit) = next.sh("echo alive", false);
            assert_eq!((stdout.as_str(), exit.code), ("alive\n", 0));
        }
    }
}

/// Runs `script` as the sandbox user; `None` when the sandbox ended before answering.
fn agent_sh_or_gone(socket: &Path, script: &str) -> Option<ExitInfo> {
    let mut stream = UnixStream::connect(socket).ok()?;
    write_json(
        &mut stream,
        &Request::Exec(ExecRequest {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            user: Some(Owner {
                uid: SANDBOX_USER,
                gid: SANDBOX_USER,
            }),
            timeout_ms: Some(20_000),
            ..Default::default()
        }),
    )
    .ok()?;
    loop {
        let frame = read_frame(&mut stream).ok()??;
        if frame.kind == FrameKind::Json
            && let Ok(Reply::Exit(exit)) = serde_json::from_slice::<Reply>(&frame.payload)
        {
            return Some(exit);
        }
    }
}

#[test]
fn nothing_is_left_after_destroy() {
    for isolation in ISOLATIONS {
        nothing_is_left_after_destroy_under(isolation);
    }
}

fn nothing_is_left_after_destroy_under(isolation: Isolation) {
    let sandbox = Sandbox::start(isolation, LIMITS);
    let (id, state, dir, runtime) = (
        sandbox.id.clone(),
        sandbox.state.clone(),
        sandbox.dir.clone(),
        sandbox.runtime.clone(),
    );
    drop(sandbox);
    let listed = Command::new(&runtime)
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

/// The resolver configuration every sandbox gets, written into `dir`.
fn resolv_conf(dir: &std::path::Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("resolv.conf");
    std::fs::write(&path, sandbase_worker::spec::RESOLV_CONF).unwrap();
    path.to_str().unwrap().to_owned()
}
