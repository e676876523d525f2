//! `sandbase worker` and the sandbox verbs, as processes: a gateway, a worker on SandBase's
//! containerd (its own namespace), and the CLI creating, running, copying and destroying.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::{BINARY, Server, free_port, stderr, stdout};

const NODE_TOKEN: &str = "cli-test-node-token-0123456789";

struct WorkerProcess {
    child: Child,
    namespace: String,
    socket: String,
    run_dir: std::path::PathBuf,
}

impl WorkerProcess {
    fn start(gateway: &str) -> WorkerProcess {
        WorkerProcess::start_as(gateway, &Uuid::new_v4().simple().to_string())
    }

    /// A worker whose namespace, run directory, id range and name derive from `unique`:
    /// starting it again with the same `unique` is the same worker restarting.
    fn start_as(gateway: &str, unique: &str) -> WorkerProcess {
        let namespace = format!("sandbase-cli-test-{unique}");
        let socket = std::env::var("SANDBASE_CONTAINERD_SOCKET")
            .unwrap_or_else(|_| "/run/sandbase/containerd.sock".to_owned());
        let run_dir = std::env::temp_dir().join(format!("sandbase-cli-run-{unique}"));
        let slot = u32::from_str_radix(&unique[..4], 16).unwrap() % 1000;
        // The operator hands this worker its own credential.
        let worker_id = format!("cli-{unique}");
        let minted = Command::new(BINARY)
            .args(["admin", "worker-credential", "--worker-id", &worker_id])
            .env("SANDBASE_WORKERS__NODE_TOKEN", NODE_TOKEN)
            .output()
            .expect("run sandbase admin worker-credential");
        assert!(minted.status.success(), "{}", stderr(&minted));
        let credential = stdout(&minted).trim().to_owned();
        let child = Command::new(BINARY)
            .args(["worker", "--gateway", gateway])
            .args(["--worker-listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--egress-proxy-port", &free_port().to_string()])
            .args(["--worker-id", &worker_id])
            .args(["--namespace", &namespace, "--containerd-socket", &socket])
            .arg("--run-dir")
            .arg(&run_dir)
            .args(["--id-base", &(3_000_000 + slot * 65_536).to_string()])
            .args(["--pool", "busybox=1", "--templates-dir", "/nonexistent"])
            .args([
                "--default-memory-mb",
                "128",
                "--default-disk-mb",
                "64",
                "--default-pids",
                "64",
            ])
            .env("SANDBASE_WORKER_CREDENTIAL", credential)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sandbase worker");
        WorkerProcess {
            child,
            namespace,
            socket,
            run_dir,
        }
    }

    /// Container ids in this worker's namespace.
    fn containers(&self) -> Vec<String> {
        let output = Command::new("ctr")
            .args([
                "--address",
                &self.socket,
                "-n",
                &self.namespace,
                "containers",
                "ls",
                "-q",
            ])
            .output()
            .unwrap();
        stdout(&output).lines().map(str::to_owned).collect()
    }

    /// SIGTERM: the worker destroys its sandboxes and exits; then its template goes too.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the worker did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
        let containers = Command::new("ctr")
            .args([
                "--address",
                &self.socket,
                "-n",
                &self.namespace,
                "containers",
                "ls",
                "-q",
            ])
            .output()
            .unwrap();
        assert_eq!(stdout(&containers).trim(), "", "containers left behind");
        let removed = Command::new("ctr")
            .args([
                "--address",
                &self.socket,
                "-n",
                &self.namespace,
                "snapshots",
                "rm",
                "sandbase/template/busybox",
            ])
            .output()
            .unwrap();
        assert!(removed.status.success(), "{}", stderr(&removed));
        let removed = Command::new("ctr")
            .args([
                "--address",
                &self.socket,
                "namespaces",
                "rm",
                &self.namespace,
            ])
            .output()
            .unwrap();
        assert!(removed.status.success(), "{}", stderr(&removed));
        let _ = sandbase_worker::runtime::remove_run_dir(&self.run_dir);
    }
}

/// A `sandbase server` whose workers take the test node token, with small busybox sandboxes.
async fn sandbox_server() -> Server {
    Server::start(&[
        ("SANDBASE_WORKERS__NODE_TOKEN", NODE_TOKEN.to_owned()),
        ("SANDBASE_SANDBOXES__DEFAULT_TEMPLATE", "busybox".to_owned()),
        (
            "SANDBASE_SANDBOXES__DEFAULT_RESOURCES__MEMORY_MB",
            "128".to_owned(),
        ),
        (
            "SANDBASE_SANDBOXES__DEFAULT_RESOURCES__DISK_MB",
            "64".to_owned(),
        ),
        (
            "SANDBASE_SANDBOXES__DEFAULT_RESOURCES__PIDS",
            "64".to_owned(),
        ),
        ("SANDBASE_PREVIEWS__DOMAIN", "preview.localhost".to_owned()),
        ("SANDBASE_PREVIEWS__SCHEME", "http".to_owned()),
    ])
    .await
}

/// Signs up through the CLI, which saves the key for the next commands.
fn sign_up(server: &Server, team: &str) {
    let email = format!("cli-{}@example.com", Uuid::new_v4().simple());
    let output = server.cli(
        &[
            "signup",
            "--email",
            &email,
            "--team",
            team,
            "--password-stdin",
        ],
        &[],
        Some("a long enough password\n"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
}

/// `sandbox create` (with `extra` arguments), retried until the worker has registered.
async fn first_sandbox(server: &Server, extra: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut args = vec!["sandbox", "create"];
    args.extend_from_slice(extra);
    loop {
        let output = server.cli(&args, &[], None);
        if output.status.success() {
            return stdout(&output).trim().to_owned();
        }
        assert!(Instant::now() < deadline, "no worker: {}", stderr(&output));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_creates_runs_copies_and_destroys_sandboxes() {
    let server = sandbox_server().await;
    let worker = WorkerProcess::start(&server.internal);
    sign_up(&server, "Sandboxes");

    let id = first_sandbox(&server, &["--timeout", "600", "--env", "WHO=cli"]).await;
    assert!(id.parse::<Uuid>().is_ok(), "{id}");

    // exec streams and exits with the command's code; piped input reaches the command.
    let output = server.cli(
        &[
            "sandbox",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo hi $WHO; echo err >&2; exit 7",
        ],
        &[],
        None,
    );
    assert_eq!(output.status.code(), Some(7));
    assert_eq!(stdout(&output), "hi cli\n");
    assert_eq!(stderr(&output), "err\n");
    let output = server.cli(
        &["sandbox", "exec", &id, "--", "tr", "a-z", "A-Z"],
        &[],
        Some("shout\n"),
    );
    assert_eq!(stdout(&output), "SHOUT\n");
    let output = server.cli(
        &["sandbox", "exec", &id, "--root", "--", "id", "-u"],
        &[],
        None,
    );
    assert_eq!(stdout(&output), "0\n");
    // A shell session keeps its directory and variables between invocations.
    let output = server.cli(
        &[
            "sandbox",
            "exec",
            &id,
            "--session",
            "main",
            "--",
            "cd /tmp && export N=4",
        ],
        &[],
        None,
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = server.cli(
        &[
            "sandbox",
            "exec",
            &id,
            "--session",
            "main",
            "--",
            "pwd; echo $N; exit 5",
        ],
        &[],
        None,
    );
    assert_eq!(
        (output.status.code(), stdout(&output).as_str()),
        (Some(5), "/tmp\n4\n")
    );

    // cp in both directions, a file and a directory; export.
    let local = std::env::temp_dir().join(format!("sandbase-cli-cp-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(local.join("project/src")).unwrap();
    std::fs::write(local.join("project/src/main.py"), "print('hello')\n").unwrap();
    let blob: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(local.join("blob.bin"), &blob).unwrap();
    let remote_blob = format!("{id}:/work/blob.bin");
    let output = server.cli(
        &[
            "sandbox",
            "cp",
            local.join("blob.bin").to_str().unwrap(),
            &remote_blob,
        ],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let output = server.cli(
        &[
            "sandbox",
            "cp",
            &remote_blob,
            local.join("back.bin").to_str().unwrap(),
        ],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(std::fs::read(local.join("back.bin")).unwrap() == blob);
    let output = server.cli(
        &[
            "sandbox",
            "cp",
            local.join("project").to_str().unwrap(),
            &format!("{id}:/work/project"),
        ],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let output = server.cli(
        &[
            "sandbox",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "cat /work/project/src/main.py && mkdir /work/out && echo result > /work/out/r.txt",
        ],
        &[],
        None,
    );
    assert_eq!(stdout(&output), "print('hello')\n", "{}", stderr(&output));
    let output = server.cli(
        &[
            "sandbox",
            "export",
            &id,
            "/work/out",
            "--to",
            local.join("exported").to_str().unwrap(),
        ],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("1 artifact saved"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        std::fs::read_to_string(local.join("exported/r.txt")).unwrap(),
        "result\n"
    );
    let output = server.cli(
        &[
            "sandbox",
            "cp",
            &format!("{id}:/work/out"),
            local.to_str().unwrap(),
        ],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        std::fs::read_to_string(local.join("out/r.txt")).unwrap(),
        "result\n"
    );

    // A terminal session fed from a pipe: the shell runs what comes, its exit code is ours.
    let output = server.cli(
        &["sandbox", "shell", &id],
        &[],
        Some("tty; echo SHELL-$((6*7)); exit 5\n"),
    );
    assert_eq!(output.status.code(), Some(5), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("SHELL-42") && stdout(&output).contains("/dev/pts/"),
        "{}",
        stdout(&output)
    );
    crate::preview::preview_step(&server, &id).await;
    // Pause and resume; a snapshot and a sandbox started from it.
    let output = server.cli(&["sandbox", "pause", &id], &[], None);
    assert!(stdout(&output).contains("is paused"), "{}", stderr(&output));
    let output = server.cli(&["sandbox", "exec", &id, "--", "true"], &[], None);
    assert!(
        stderr(&output).contains("sandbox_paused"),
        "{}",
        stderr(&output)
    );
    let output = server.cli(&["sandbox", "resume", &id], &[], None);
    assert!(
        stdout(&output).contains("is running"),
        "{}",
        stderr(&output)
    );
    let output = server.cli(&["sandbox", "snapshot", &id], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let snapshot = stdout(&output).trim().to_owned();
    let output = server.cli(
        &["sandbox", "create", "--from-snapshot", &snapshot],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let fork = stdout(&output).trim().to_owned();
    let output = server.cli(
        &["sandbox", "exec", &fork, "--", "cat", "/work/out/r.txt"],
        &[],
        None,
    );
    assert_eq!(stdout(&output), "result\n", "{}", stderr(&output));
    let output = server.cli(&["sandbox", "destroy", &fork], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));

    // ls, get, extend, destroy.
    let output = server.cli(&["sandbox", "ls"], &[], None);
    assert!(
        stdout(&output).contains(&id) && stdout(&output).contains("running"),
        "{}",
        stdout(&output)
    );
    let output = server.cli(&["sandbox", "extend", &id, "1200"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let output = server.cli(&["--json", "sandbox", "get", &id], &[], None);
    let sandbox: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(sandbox["state"], "running");
    // export --destroy: the sandbox goes once its export is written.
    let output = server.cli(
        &[
            "sandbox",
            "export",
            &id,
            "/work/out",
            "--destroy",
            "--to",
            local.join("last").to_str().unwrap(),
        ],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(local.join("last/r.txt").exists());
    assert!(
        stderr(&output).contains(&format!("destroyed {id}")),
        "{}",
        stderr(&output)
    );
    let output = server.cli(&["sandbox", "exec", &id, "--", "true"], &[], None);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("sandbox_not_running"),
        "{}",
        stderr(&output)
    );
    let output = server.cli(&["sandbox", "get", &id], &[], None);
    assert!(
        stdout(&output).contains("stopped (destroyed)"),
        "{}",
        stdout(&output)
    );

    // `sandbase run`: inputs in, output printed, artifact downloaded, exit code kept.
    std::fs::create_dir_all(local.join("inputs")).unwrap();
    std::fs::write(local.join("inputs/x.txt"), "payload\n").unwrap();
    let output = server.cli(
        &[
            "run",
            "--input",
            local.join("inputs").to_str().unwrap(),
            "--download-to",
            local.join("artifact").to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "tr a-z A-Z < /work/in/x.txt > /work/out/y.txt; echo done; exit 3",
        ],
        &[],
        None,
    );
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert_eq!(stdout(&output), "done\n");
    assert_eq!(
        std::fs::read_to_string(local.join("artifact/y.txt")).unwrap(),
        "PAYLOAD\n"
    );

    // Templates: a root file system tarball imported by the operator, listed, used, removed.
    let rootfs = local.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("busybox")).unwrap();
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::os::unix::fs::symlink("/busybox", rootfs.join("bin/sh")).unwrap();
    std::os::unix::fs::symlink("/busybox", rootfs.join("bin/cat")).unwrap();
    std::fs::write(rootfs.join("hello.txt"), "from the tarball\n").unwrap();
    let tarball = local.join("rootfs.tar");
    let packed = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tarball)
        .arg(".")
        .status()
        .unwrap();
    assert!(packed.success());
    let operator = [("SANDBASE_OPERATOR_TOKEN", crate::OPERATOR_TOKEN)];
    let output = server.cli(
        &[
            "template",
            "import",
            tarball.to_str().unwrap(),
            "--name",
            "tiny",
            "--rootfs",
        ],
        &operator,
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("done"), "{}", stderr(&output));
    let output = server.cli(
        &[
            "template",
            "import",
            tarball.to_str().unwrap(),
            "--name",
            "tiny",
            "--rootfs",
        ],
        &[("SANDBASE_OPERATOR_TOKEN", NODE_TOKEN)],
        None,
    );
    assert!(!output.status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let output = server.cli(&["template", "ls"], &[], None);
        if stdout(&output).contains("tiny") {
            break;
        }
        assert!(Instant::now() < deadline, "{}", stdout(&output));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let output = server.cli(&["sandbox", "create", "--template", "tiny"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let tiny = stdout(&output).trim().to_owned();
    let output = server.cli(
        &["sandbox", "exec", &tiny, "--", "cat", "/hello.txt"],
        &[],
        None,
    );
    assert_eq!(stdout(&output), "from the tarball\n", "{}", stderr(&output));
    let output = server.cli(&["sandbox", "destroy", &tiny], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let output = server.cli(&["template", "rm", "tiny"], &operator, None);
    assert!(output.status.success(), "{}", stderr(&output));

    // A sandbox left running is destroyed when the worker stops.
    let output = server.cli(&["sandbox", "create"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    std::fs::remove_dir_all(&local).unwrap();
    worker.stop();
}

/// `kill -9` of the worker process with a sandbox running: the restarted worker removes the
/// container, its snapshot, its cgroup and its control directory, and the gateway marks the
/// sandbox lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_with_sigkill_leaves_nothing_once_restarted() {
    let server = sandbox_server().await;
    let unique = Uuid::new_v4().simple().to_string();
    let mut worker = WorkerProcess::start_as(&server.internal, &unique);
    sign_up(&server, "Crash");
    let id = first_sandbox(&server, &[]).await;
    let output = server.cli(
        &[
            "sandbox",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "sleep 600 & echo started",
        ],
        &[],
        None,
    );
    assert_eq!(stdout(&output), "started\n", "{}", stderr(&output));
    let before = worker.containers();
    assert!(!before.is_empty());
    let cgroups = |containers: &[String]| {
        containers
            .iter()
            .filter(|id| {
                Command::new("sh")
                    .args([
                        "-c",
                        &format!(
                            "find /sys/fs/cgroup -maxdepth 3 -type d -name '{id}' | grep -q ."
                        ),
                    ])
                    .status()
                    .is_ok_and(|status| status.success())
            })
            .count()
    };
    assert_eq!(cgroups(&before), before.len(), "every sandbox has a cgroup");

    // SIGKILL: nothing is cleaned up by the worker itself.
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    assert_eq!(worker.containers().len(), before.len());

    let restarted = WorkerProcess::start_as(&server.internal, &unique);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let output = server.cli(&["sandbox", "get", &id], &[], None);
        if stdout(&output).contains("stopped (lost)") {
            break;
        }
        assert!(Instant::now() < deadline, "{}", stdout(&output));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = restarted.containers();
    assert!(
        before.iter().all(|old| !after.contains(old)),
        "{before:?} still in {after:?}"
    );
    assert_eq!(
        cgroups(&before),
        0,
        "cgroups of the killed worker's sandboxes remain"
    );
    for old in &before {
        assert!(
            !restarted.run_dir.join(old).exists(),
            "control directory of {old} remains"
        );
    }
    let snapshots = Command::new("ctr")
        .args([
            "--address",
            &restarted.socket,
            "-n",
            &restarted.namespace,
            "snapshots",
            "ls",
        ])
        .output()
        .unwrap();
    for old in &before {
        assert!(
            !stdout(&snapshots).contains(old.as_str()),
            "snapshot of {old} remains"
        );
    }
    // The restarted worker serves new sandboxes.
    let output = server.cli(&["sandbox", "create"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let fresh = stdout(&output).trim().to_owned();
    let output = server.cli(
        &["sandbox", "exec", &fresh, "--", "echo", "alive"],
        &[],
        None,
    );
    assert_eq!(stdout(&output), "alive\n");
    restarted.stop();
}
