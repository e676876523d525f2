//! Running a command: resolved like a shell would, spawned in its own process group as the
//! sandbox user, its output, exit and timeout watched with poll(2) on the connection's own
//! thread (no new thread, so it works even when the sandbox has used up its pids).

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, Signal, WaitStatus};

use crate::protocol::{
    AgentError, ExecRequest, ExitInfo, FrameKind, Reply, read_frame, write_frame,
};

use crate::reaper::{children, spawns};
use crate::reply::{lock, reply, reply_error};

/// How long output may keep flowing after the process exited (from children it left
/// running with the same pipes) before the exit is reported anyway.
const OUTPUT_DRAIN: Duration = Duration::from_millis(250);
/// The OOM score adjustment of every process the agent starts: the most, so a command is
/// what goes first, in the sandbox (before the agent, at 500) and on the host.
const COMMAND_OOM_SCORE_ADJ: &str = "1000";
/// How often a running process is checked for exit and timeout between output.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs a command to its end: `Started`, its output as frames, then `Exit` (or an error).
pub(crate) fn exec(
    request: ExecRequest,
    reader: &mut UnixStream,
    writer: &Arc<Mutex<UnixStream>>,
) -> io::Result<()> {
    let mut command = match command_for(&request) {
        Ok(command) => command,
        Err(refusal) => return reply(writer, &refusal),
    };
    let started = Instant::now();
    let (sender, receiver) = mpsc::channel();
    let mut child = match spawn_registered(&mut command, sender) {
        Ok(child) => child,
        Err(error) => {
            let program = request.argv.first().map_or("", String::as_str);
            return reply(
                writer,
                &Reply::Error(AgentError {
                    kind: if error.kind() == io::ErrorKind::NotFound {
                        "not_found".to_owned()
                    } else {
                        "spawn_failed".to_owned()
                    },
                    message: format!("starting {program:?}: {error}"),
                }),
            );
        }
    };
    let pid = child.id();
    // What the agent starts is what the OOM killer picks first when the sandbox runs out of
    // memory, not the agent (raising a score needs no privilege; lowering the agent's would).
    let _ = fs::write(format!("/proc/{pid}/oom_score_adj"), COMMAND_OOM_SCORE_ADJ);
    reply(writer, &Reply::Started { pid })?;

    // Both pipes as plain files, so one loop can poll and read them alike.
    let stdout = child
        .stdout
        .take()
        .map(|pipe| fs::File::from(std::os::fd::OwnedFd::from(pipe)));
    let stderr = child
        .stderr
        .take()
        .map(|pipe| fs::File::from(std::os::fd::OwnedFd::from(pipe)));
    if let Some(stdin) = child.stdin.take()
        && let Err(error) = feed_stdin(stdin, reader)
    {
        kill_group(pid);
        return reply_error(writer, &error, "feeding standard input");
    }
    // The `Child` is never waited on: the reaper owns every exit status.
    drop(child);
    let mut watch = Watch {
        pid,
        outputs: [(stdout, FrameKind::Stdout), (stderr, FrameKind::Stderr)],
        deadline: request
            .timeout_ms
            .map(|ms| started + Duration::from_millis(ms)),
        timed_out: false,
        exited: None,
        receiver,
    };
    let status = match watch.until_exit(writer)? {
        Some(status) => status,
        None => return reply(writer, &lost_track()),
    };
    if watch.timed_out {
        // Whatever it left behind goes too.
        kill_group(pid);
    }
    let signal = status.terminating_signal();
    let code = status
        .exit_status()
        .or_else(|| signal.map(|signal| 128 + signal))
        .unwrap_or(-1);
    reply(
        writer,
        &Reply::Exit(ExitInfo {
            code,
            signal,
            timed_out: watch.timed_out,
            duration_ms: started.elapsed().as_millis() as u64,
        }),
    )
}

/// The command of a request, or the refusal to answer: its program resolved here (a failed
/// exec in the child would make the standard library wait for that child itself, racing
/// the reaper), a clean environment, its own process group, the user asked for.
fn command_for(request: &ExecRequest) -> Result<Command, Reply> {
    let Some(program) = request.argv.first() else {
        return Err(Reply::Error(AgentError {
            kind: "invalid".to_owned(),
            message: "empty command".to_owned(),
        }));
    };
    let search_path = request.env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
    let Some(resolved) = resolve_program(program, search_path, request.cwd.as_deref()) else {
        return Err(Reply::Error(AgentError {
            kind: "not_found".to_owned(),
            message: format!("{program}: command not found"),
        }));
    };
    let mut command = Command::new(resolved);
    command.arg0(program);
    command
        .args(&request.argv[1..])
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .envs(&request.env)
        .stdin(if request.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout or kill reaches everything it started.
        .process_group(0);
    if let Some(cwd) = &request.cwd {
        command.current_dir(cwd);
    }
    if let Some(user) = request.user {
        command.uid(user.uid).gid(user.gid);
        // Switching away from root, the standard library also clears the supplementary
        // groups (`setgroups(0)`), so the process keeps none of the agent's.
    }
    Ok(command)
}

/// Spawns the command with its exit channel registered under the reaper's lock (so the
/// reaper cannot see the exit first), and wakes the reaper.
pub(crate) fn spawn_registered(
    command: &mut Command,
    sender: mpsc::Sender<WaitStatus>,
) -> io::Result<std::process::Child> {
    let spawned = {
        let mut children = children();
        command.spawn().inspect(|child| {
            let pid = child.id();
            match children.early.remove(&pid) {
                Some(status) => {
                    let _ = sender.send(status);
                }
                None => {
                    children.waiting.insert(pid, sender);
                }
            }
        })
    };
    let (count, wakeup) = spawns();
    *count
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
    wakeup.notify_all();
    spawned
}

/// Data frames from the connection go to the process's standard input (a thread of its
/// own, which the command cannot starve of anything but pids); end of input closes it.
fn feed_stdin(mut stdin: std::process::ChildStdin, reader: &UnixStream) -> io::Result<()> {
    let mut input = reader.try_clone()?;
    thread::Builder::new()
        .name("stdin".to_owned())
        .stack_size(crate::threads::SMALL_STACK)
        .spawn(move || {
            while let Ok(Some(frame)) = read_frame(&mut input) {
                if frame.kind != FrameKind::Data || stdin.write_all(&frame.payload).is_err() {
                    break;
                }
            }
            // Dropping `stdin` closes the pipe: the process sees end of input.
        })
        .map(drop)
}

/// A running command watched with poll(2): output, exit and deadline together.
struct Watch {
    pid: u32,
    outputs: [(Option<fs::File>, FrameKind); 2],
    deadline: Option<Instant>,
    timed_out: bool,
    exited: Option<(WaitStatus, Instant)>,
    receiver: mpsc::Receiver<WaitStatus>,
}

impl Watch {
    /// Relays output until the process exited and its pipes closed (or drained for
    /// `OUTPUT_DRAIN`); kills it at its deadline. `None`: the reaper lost track of it.
    fn until_exit(&mut self, writer: &Mutex<UnixStream>) -> io::Result<Option<WaitStatus>> {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            if self.exited.is_none() {
                match self.receiver.try_recv() {
                    Ok(status) => self.exited = Some((status, Instant::now())),
                    Err(mpsc::TryRecvError::Empty) => {}
                    Err(mpsc::TryRecvError::Disconnected) => return Ok(None),
                }
            }
            let open = self.outputs.iter().any(|(pipe, _)| pipe.is_some());
            if let Some((status, at)) = self.exited
                && (!open || at.elapsed() >= OUTPUT_DRAIN)
            {
                return Ok(Some(status));
            }
            if !self.timed_out
                && self.exited.is_none()
                && self
                    .deadline
                    .is_some_and(|deadline| Instant::now() >= deadline)
            {
                self.timed_out = true;
                kill_group(self.pid);
            }
            if !open {
                if !self.wait_for_exit() {
                    return Ok(None);
                }
                continue;
            }
            let ready = match self.poll_outputs() {
                Ok(ready) => ready,
                Err(error) => {
                    reply_error(writer, &error, "watching output")?;
                    return Err(error);
                }
            };
            self.relay_ready(ready, &mut buffer, writer)?;
        }
    }

    /// Output is done; only the exit (or the deadline) is left to wait for. `false` when
    /// the reaper dropped the channel.
    fn wait_for_exit(&mut self) -> bool {
        let wait = self
            .deadline
            .map_or(Duration::from_secs(1), |deadline| {
                deadline.saturating_duration_since(Instant::now())
            })
            .clamp(Duration::from_millis(1), Duration::from_secs(1));
        match self.receiver.recv_timeout(wait) {
            Ok(status) => {
                self.exited = Some((status, Instant::now()));
                true
            }
            Err(mpsc::RecvTimeoutError::Timeout) => true,
            Err(mpsc::RecvTimeoutError::Disconnected) => false,
        }
    }

    /// Which open pipes have something to read (or closed), waiting at most `POLL_INTERVAL`.
    fn poll_outputs(&self) -> io::Result<[bool; 2]> {
        let mut ready = [false; 2];
        let mut fds = Vec::with_capacity(2);
        let mut slots = Vec::with_capacity(2);
        for (index, (pipe, _)) in self.outputs.iter().enumerate() {
            if let Some(pipe) = pipe {
                fds.push(PollFd::new(pipe, PollFlags::IN));
                slots.push(index);
            }
        }
        let timeout = Timespec {
            tv_sec: 0,
            tv_nsec: POLL_INTERVAL.as_nanos() as i64,
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) => {
                for (fd, index) in fds.iter().zip(slots) {
                    ready[index] = !fd.revents().is_empty();
                }
                Ok(ready)
            }
            Err(rustix::io::Errno::INTR) => Ok(ready),
            Err(error) => Err(io::Error::from(error)),
        }
    }

    /// Reads what the ready pipes hold and sends it as frames; a pipe at its end closes.
    fn relay_ready(
        &mut self,
        ready: [bool; 2],
        buffer: &mut [u8],
        writer: &Mutex<UnixStream>,
    ) -> io::Result<()> {
        for (index, (pipe, kind)) in self.outputs.iter_mut().enumerate() {
            if !ready[index] {
                continue;
            }
            let Some(stream) = pipe.as_mut() else {
                continue;
            };
            match stream.read(buffer) {
                Ok(0) | Err(_) => *pipe = None,
                Ok(read) => {
                    if let Err(error) = write_frame(&mut *lock(writer), *kind, &buffer[..read]) {
                        // Nobody is listening any more: the command goes with its caller.
                        kill_group(self.pid);
                        return Err(error);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Finds an executable the way a shell would: as given when it has a `/`, else on `PATH`.
pub(crate) fn resolve_program(
    program: &str,
    search_path: &str,
    cwd: Option<&str>,
) -> Option<std::path::PathBuf> {
    let executable = |path: &Path| {
        fs::metadata(path).is_ok_and(|metadata| metadata.is_file() && metadata.mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = match cwd {
            Some(cwd) if !program.starts_with('/') => Path::new(cwd).join(program),
            _ => Path::new(program).to_path_buf(),
        };
        return executable(&path).then_some(path);
    }
    search_path
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(program))
        .find(|candidate| executable(candidate))
}

/// The answer when the reaper dropped a process's exit channel, which should not happen.
pub(crate) fn lost_track() -> Reply {
    Reply::Error(AgentError {
        kind: "io".to_owned(),
        message: "lost track of the process".to_owned(),
    })
}

pub(crate) fn kill_group(pid: u32) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    }
}
