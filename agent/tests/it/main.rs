//! The agent as a real process: as PID 1 of a new PID namespace when the tests run as root
//! (as CI does), talking the real protocol over its socket.

#![allow(clippy::unwrap_used)] // Tests panic on purpose when an expectation fails.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbase_agent::protocol::{
    ExecRequest, ExitInfo, FrameKind, Owner, Reply, Request, read_frame, read_json, write_frame,
    write_json,
};

struct Agent {
    child: Child,
    socket: PathBuf,
    dir: PathBuf,
    /// Whether the agent is PID 1 of its own PID namespace.
    pid_one: bool,
}

impl Agent {
    fn start() -> Agent {
        let dir = std::env::temp_dir().join(format!(
            "sandbase-agent-test-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("agent.sock");
        let binary = env!("CARGO_BIN_EXE_sandbase-agent");
        let is_root = rustix_is_root();
        let mut command = if is_root {
            let mut command = Command::new("unshare");
            command.args(["--pid", "--fork", "--kill-child", "--mount-proc", binary]);
            command
        } else {
            Command::new(binary)
        };
        let child = command
            .args(["--socket", socket.to_str().unwrap()])
            .stdin(Stdio::null())
            .spawn()
            .expect("start the agent");
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the agent did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Agent {
            child,
            socket,
            dir,
            pid_one: is_root,
        }
    }

    fn connect(&self, request: &Request) -> UnixStream {
        let mut stream = UnixStream::connect(&self.socket).unwrap();
        write_json(&mut stream, request).unwrap();
        stream
    }

    /// Runs a command; returns (stdout, stderr, exit).
    fn exec(
        &self,
        request: ExecRequest,
        stdin: Option<&[u8]>,
    ) -> Result<(Vec<u8>, Vec<u8>, ExitInfo), String> {
        let with_stdin = stdin.is_some();
        let mut stream = self.connect(&Request::Exec(ExecRequest {
            stdin: with_stdin,
            ..request
        }));
        if let Some(input) = stdin {
            for chunk in input.chunks(1000) {
                write_frame(&mut stream, FrameKind::Data, chunk).unwrap();
            }
            write_frame(&mut stream, FrameKind::End, &[]).unwrap();
        }
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        loop {
            let frame = read_frame(&mut stream).unwrap().expect("a frame");
            match frame.kind {
                FrameKind::Stdout => stdout.extend(frame.payload),
                FrameKind::Stderr => stderr.extend(frame.payload),
                FrameKind::Json => match serde_json::from_slice::<Reply>(&frame.payload).unwrap() {
                    Reply::Started { .. } => {}
                    Reply::Exit(exit) => return Ok((stdout, stderr, exit)),
                    Reply::Error(error) => return Err(error.kind),
                    other => panic!("unexpected {other:?}"),
                },
                other => panic!("unexpected frame {other:?}"),
            }
        }
    }

    fn shell(&self, script: &str) -> (String, String, ExitInfo) {
        let (stdout, stderr, exit) = self
            .exec(
                ExecRequest {
                    argv: vec!["sh".into(), "-c".into(), script.into()],
                    ..Default::default()
                },
                None,
            )
            .unwrap();
        (
            String::from_utf8(stdout).unwrap(),
            String::from_utf8(stderr).unwrap(),
            exit,
        )
    }

    fn simple(&self, request: &Request) -> Reply {
        let mut stream = self.connect(request);
        read_json(&mut stream).unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

mod pty;

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn rustix_is_root() -> bool {
    // The effective uid, read from /proc so the test needs no extra dependency.
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|uid| uid == "0"))
        .unwrap_or(false)
}

#[test]
fn runs_commands_with_output_exit_codes_env_cwd_and_stdin() {
    let agent = Agent::start();
    let (stdout, stderr, exit) = agent.shell("echo out; echo err >&2; exit 3");
    assert_eq!(
        (stdout.as_str(), stderr.as_str(), exit.code, exit.timed_out),
        ("out\n", "err\n", 3, false)
    );

    let (stdout, _, exit) = agent
        .exec(
            ExecRequest {
                argv: vec!["sh".into(), "-c".into(), "echo $GREETING; pwd".into()],
                env: [("GREETING".to_owned(), "hello".to_owned())].into(),
                cwd: Some("/tmp".into()),
                ..Default::default()
            },
            None,
        )
        .unwrap();
    assert_eq!(
        (String::from_utf8(stdout).unwrap(), exit.code),
        ("hello\n/tmp\n".to_owned(), 0)
    );

    // Standard input, larger than one frame, comes back intact.
    let input: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let (stdout, _, exit) = agent
        .exec(
            ExecRequest {
                argv: vec!["cat".into()],
                ..Default::default()
            },
            Some(&input),
        )
        .unwrap();
    assert_eq!(exit.code, 0);
    assert_eq!(stdout, input);

    // Unknown programs are reported, not crashed on.
    let error = agent
        .exec(
            ExecRequest {
                argv: vec!["no-such-program".into()],
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
    assert_eq!(error, "not_found");
    let error = agent.exec(ExecRequest::default(), None).unwrap_err();
    assert_eq!(error, "invalid");
    assert_eq!(agent.simple(&Request::Ping), Reply::Ok(None));
}

#[test]
fn a_timeout_kills_the_whole_process_group() {
    let agent = Agent::start();
    let marker = agent.dir.join("survivor");
    let script = format!("(sleep 2; touch {}) & sleep 30", marker.display());
    let started = Instant::now();
    let (_, _, exit) = agent
        .exec(
            ExecRequest {
                argv: vec!["sh".into(), "-c".into(), script],
                timeout_ms: Some(300),
                ..Default::default()
            },
            None,
        )
        .unwrap();
    assert!(exit.timed_out);
    assert_eq!((exit.signal, exit.code), (Some(9), 137));
    assert!(started.elapsed() < Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!marker.exists(), "a background child outlived the timeout");
}

#[test]
fn commands_run_as_the_requested_user() {
    let agent = Agent::start();
    if !agent.pid_one {
        return; // Switching users needs root; CI runs as root.
    }
    let (stdout, _, exit) = agent
        .exec(
            ExecRequest {
                argv: vec!["sh".into(), "-c".into(), "id -u; id -G".into()],
                user: Some(Owner {
                    uid: 65534,
                    gid: 65534,
                }),
                ..Default::default()
            },
            None,
        )
        .unwrap();
    // Its own uid and group only: none of the agent's (root's) supplementary groups.
    assert_eq!(
        (String::from_utf8(stdout).unwrap(), exit.code),
        ("65534\n65534\n".to_owned(), 0)
    );
    // And that user cannot write where it has no permission.
    let (_, _, exit) = agent
        .exec(
            ExecRequest {
                argv: vec!["touch".into(), "/root/forbidden".into()],
                user: Some(Owner {
                    uid: 65534,
                    gid: 65534,
                }),
                ..Default::default()
            },
            None,
        )
        .unwrap();
    assert_ne!(exit.code, 0);
}

#[test]
fn as_pid_one_it_reaps_orphans() {
    let agent = Agent::start();
    if !agent.pid_one {
        return;
    }
    let (stdout, _, _) = agent.shell("echo $$");
    assert_ne!(stdout.trim(), "1", "the shell is not PID 1: the agent is");
    // Orphans that exit are re-parented to the agent and must not stay zombies.
    for _ in 0..5 {
        agent.shell("(sleep 0.1 &) ; true");
    }
    std::thread::sleep(Duration::from_millis(500));
    let (stdout, _, _) =
        agent.shell("cat /proc/[0-9]*/stat 2>/dev/null | awk '{print $3}' | sort | uniq -c");
    assert!(!stdout.contains(" Z"), "zombies remain:\n{stdout}");
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[test]
fn file_operations() {
    let agent = Agent::start();
    let root = agent.dir.join("files");
    let file = root.join("deep/dir/hello.txt");
    let path = file.to_str().unwrap().to_owned();

    // Write (parents created), read back, stat, list.
    let mut stream = agent.connect(&Request::WriteFile {
        path: path.clone(),
        mode: Some(0o640),
        owner: None,
    });
    write_frame(&mut stream, FrameKind::Data, b"hello ").unwrap();
    write_frame(&mut stream, FrameKind::Data, b"world").unwrap();
    write_frame(&mut stream, FrameKind::End, &[]).unwrap();
    match read_json::<Reply>(&mut stream).unwrap() {
        Reply::Ok(Some(stat)) => assert_eq!(
            (stat.kind.as_str(), stat.size, stat.mode),
            ("file", 11, 0o640)
        ),
        other => panic!("{other:?}"),
    }
    let mut stream = agent.connect(&Request::ReadFile { path: path.clone() });
    assert!(matches!(
        read_json::<Reply>(&mut stream).unwrap(),
        Reply::Ok(Some(_))
    ));
    let mut content = Vec::new();
    loop {
        let frame = read_frame(&mut stream).unwrap().unwrap();
        match frame.kind {
            FrameKind::Data => content.extend(frame.payload),
            FrameKind::End => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(content, b"hello world");
    match agent.simple(&Request::List {
        path: root.join("deep/dir").to_str().unwrap().into(),
    }) {
        Reply::Listing(entries) => {
            assert_eq!(entries.len(), 1);
            assert_eq!(entries[0].name, "hello.txt");
        }
        other => panic!("{other:?}"),
    }

    // Rename, mkdir, symlinks are reported as such, remove.
    let renamed = root.join("renamed.txt");
    assert!(matches!(
        agent.simple(&Request::Rename {
            from: path.clone(),
            to: renamed.to_str().unwrap().into()
        }),
        Reply::Ok(_)
    ));
    std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
    match agent.simple(&Request::Stat {
        path: root.join("link").to_str().unwrap().into(),
    }) {
        Reply::Ok(Some(stat)) => {
            assert_eq!(stat.kind, "symlink");
            assert_eq!(stat.link_target.as_deref(), Some("/etc/passwd"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        agent.simple(&Request::Mkdir {
            path: root.join("a/b/c").to_str().unwrap().into(),
            owner: None
        }),
        Reply::Ok(Some(_))
    ));

    // Errors carry a kind.
    for (request, kind) in [
        (Request::ReadFile { path }, "not_found"),
        (
            Request::ReadFile {
                path: root.to_str().unwrap().into(),
            },
            "is_a_directory",
        ),
        (
            Request::Remove {
                path: root.join("a").to_str().unwrap().into(),
                recursive: false,
            },
            "not_empty",
        ),
        (
            Request::List {
                path: renamed.to_str().unwrap().into(),
            },
            "not_a_directory",
        ),
    ] {
        match agent.simple(&request) {
            Reply::Error(error) => assert_eq!(error.kind, kind, "{request:?}: {}", error.message),
            other => panic!("{request:?}: {other:?}"),
        }
    }
    assert!(matches!(
        agent.simple(&Request::Remove {
            path: root.to_str().unwrap().into(),
            recursive: true
        }),
        Reply::Ok(None)
    ));
    assert!(!root.exists());
}

#[test]
fn a_malformed_request_closes_only_its_connection() {
    let agent = Agent::start();
    let mut stream = UnixStream::connect(&agent.socket).unwrap();
    write_frame(&mut stream, FrameKind::Json, b"{\"op\":\"format_disk\"}").unwrap();
    assert!(read_frame(&mut stream).unwrap_or(None).is_none());
    let mut stream = UnixStream::connect(&agent.socket).unwrap();
    std::io::Write::write_all(&mut stream, &[9, 255, 255, 255, 255]).unwrap();
    assert!(read_frame(&mut stream).unwrap_or(None).is_none());
    // The agent still serves.
    assert_eq!(agent.simple(&Request::Ping), Reply::Ok(None));
}
