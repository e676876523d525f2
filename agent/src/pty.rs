//! Terminal sessions: a command on a pseudo-terminal of its own, as the leader of a new
//! session with the terminal as its controlling one (the agent re-executes itself as a small
//! helper that calls `setsid` and `TIOCSCTTY`, then the command: no `unsafe` anywhere).
//!
//! The agent keeps the master and the last [`RING`] bytes of output, numbered from the
//! session's first byte, so a peer that attaches again with `since` gets exactly what it
//! missed (or learns it lagged). A session outlives the connections attached to it; an
//! attachment takes two threads of its own (output and input) only while it lasts, so
//! sessions never hold the agent's connection threads.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitStatus};

use crate::exec::{DEFAULT_PATH, resolve_program, spawn_registered};
use crate::protocol::{
    AgentError, ExitInfo, FrameKind, PtyControl, PtyRequest, Reply, read_frame, write_frame,
};
use crate::reply::{lock, reply};

/// Output kept per session (bytes).
pub const RING: usize = 1 << 20;
/// Sessions kept at once (exited ones are forgotten first).
const MAX_SESSIONS: usize = 8;
/// How long output may keep coming after the command exited (from what it left running on
/// the terminal) before the session ends anyway.
const OUTPUT_DRAIN: Duration = Duration::from_millis(250);
const DATA_CHUNK: usize = 64 * 1024;
/// How long a holding reader may keep the terminal unread before it is let go.
pub const HOLD_LIMIT: Duration = Duration::from_secs(10);

struct Output {
    ring: VecDeque<u8>,
    /// Offset of `ring[0]` since the session's first byte.
    start: u64,
    exit: Option<ExitInfo>,
    /// No more output will come.
    ended: bool,
    /// Where the holding reader is (see `Request::PtyAttach`'s `hold`).
    held_at: Option<u64>,
}

impl Output {
    fn end(&self) -> u64 {
        self.start + self.ring.len() as u64
    }

    fn push(&mut self, bytes: &[u8]) {
        self.ring.extend(bytes);
        let excess = self.ring.len().saturating_sub(RING);
        self.ring.drain(..excess);
        self.start += excess as u64;
    }

    /// Whether the holding reader is so far behind that reading more would drop bytes
    /// it has not had.
    fn held_back(&self) -> bool {
        self.held_at
            .is_some_and(|held| self.end() - held + DATA_CHUNK as u64 > RING as u64)
    }

    /// Up to `max` bytes from `offset` (which must be within the ring).
    fn read_from(&self, offset: u64, max: usize) -> Vec<u8> {
        let skip = (offset - self.start) as usize;
        self.ring.iter().skip(skip).take(max).copied().collect()
    }
}

struct Session {
    pid: u32,
    master: File,
    output: Mutex<Output>,
    changed: Condvar,
}

impl Session {
    fn output(&self) -> MutexGuard<'_, Output> {
        self.output
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn sessions() -> MutexGuard<'static, HashMap<u32, Arc<Session>>> {
    static SESSIONS: OnceLock<Mutex<HashMap<u32, Arc<Session>>>> = OnceLock::new();
    SESSIONS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn refuse(writer: &Mutex<UnixStream>, kind: &str, message: String) -> io::Result<()> {
    reply(
        writer,
        &Reply::Error(AgentError {
            kind: kind.to_owned(),
            message,
        }),
    )
}

/// Makes room for a new session: exited ones are forgotten (their terminals closed);
/// `false` when every kept session still runs.
fn make_room() -> bool {
    let mut sessions = sessions();
    if sessions.len() < MAX_SESSIONS {
        return true;
    }
    let ended: Vec<u32> = sessions
        .iter()
        .filter(|(_, session)| session.output().ended)
        .map(|(id, _)| *id)
        .collect();
    for id in ended {
        sessions.remove(&id);
    }
    sessions.len() < MAX_SESSIONS
}

/// A new pseudo-terminal of `cols` × `rows`: (master, slave).
fn new_terminal(cols: u16, rows: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pty::OpenptFlags;
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let path = rustix::pty::ptsname(&master, Vec::new())?;
    // Never the agent's own controlling terminal (it may be a session leader without one).
    let slave = rustix::fs::open(
        path.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    resize(&master, cols, rows)?;
    Ok((master, slave))
}

fn resize(terminal: &impl AsFd, cols: u16, rows: u16) -> io::Result<()> {
    rustix::termios::tcsetwinsize(
        terminal,
        rustix::termios::Winsize {
            ws_row: rows.max(1),
            ws_col: cols.max(1),
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    Ok(())
}

/// The helper's command line: the agent itself, then the command resolved like a shell
/// would (a shell when none is given: bash when the sandbox has it).
fn command_for(request: &PtyRequest, slave: &OwnedFd) -> Result<Command, String> {
    let argv = if request.argv.is_empty() {
        let shell = ["/bin/bash", "/usr/bin/bash"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists())
            .unwrap_or("/bin/sh");
        vec![shell.to_owned()]
    } else {
        request.argv.clone()
    };
    // A directory that is not there is the caller's to fix (not found), not a failed start.
    if let Some(cwd) = &request.cwd
        && !std::path::Path::new(cwd).is_dir()
    {
        return Err(format!("{cwd}: no such directory"));
    }
    let search_path = request.env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
    let program = resolve_program(&argv[0], search_path, request.cwd.as_deref())
        .ok_or_else(|| format!("{}: command not found", argv[0]))?;
    let helper = std::env::current_exe().map_err(|error| format!("the agent's path: {error}"))?;
    let mut command = Command::new(helper);
    command
        .arg("--pty-helper")
        .arg(program)
        .args(&argv)
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .env("TERM", "xterm-256color")
        .envs(&request.env);
    let terminal = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
    let (stdin, stdout, stderr) = (terminal(slave), terminal(slave), terminal(slave));
    let (Ok(stdin), Ok(stdout), Ok(stderr)) = (stdin, stdout, stderr) else {
        return Err("duplicating the terminal".to_owned());
    };
    command.stdin(stdin).stdout(stdout).stderr(stderr);
    if let Some(cwd) = &request.cwd {
        command.current_dir(cwd);
    }
    if let Some(user) = request.user {
        command.uid(user.uid).gid(user.gid);
    }
    Ok(command)
}

/// Opens a session and answers `PtyOpened`.
pub(crate) fn open(request: PtyRequest, writer: &Mutex<UnixStream>) -> io::Result<()> {
    if !make_room() {
        return refuse(
            writer,
            "invalid",
            format!("at most {MAX_SESSIONS} terminal sessions run at once"),
        );
    }
    let (master, slave) = match new_terminal(request.cols, request.rows) {
        Ok(pair) => pair,
        Err(error) => return refuse(writer, "io", format!("opening a terminal: {error}")),
    };
    if let Some(user) = request.user {
        // The terminal is its user's, as a login's is.
        let _ = std::os::unix::fs::fchown(&slave, Some(user.uid), Some(user.gid));
    }
    let mut command = match command_for(&request, &slave) {
        Ok(command) => command,
        Err(message) => return refuse(writer, "not_found", message),
    };
    let (sender, receiver) = mpsc::channel();
    let child = match spawn_registered(&mut command, sender) {
        Ok(child) => child,
        Err(error) => {
            return refuse(
                writer,
                "spawn_failed",
                format!("starting the terminal: {error}"),
            );
        }
    };
    // Only the command holds the terminal's slave side now.
    drop(command);
    drop(slave);
    let pid = child.id();
    drop(child);
    let _ = std::fs::write(format!("/proc/{pid}/oom_score_adj"), "1000");
    let session = Arc::new(Session {
        pid,
        master: File::from(master),
        output: Mutex::new(Output {
            ring: VecDeque::new(),
            start: 0,
            exit: None,
            ended: false,
            held_at: None,
        }),
        changed: Condvar::new(),
    });
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    sessions().insert(id, Arc::clone(&session));
    let reading = Arc::clone(&session);
    let started = thread::Builder::new()
        .name("pty".to_owned())
        .stack_size(crate::threads::SMALL_STACK)
        .spawn(move || read_terminal(&reading, &receiver));
    if let Err(error) = started {
        crate::exec::kill_group(pid);
        sessions().remove(&id);
        return refuse(
            writer,
            "spawn_failed",
            format!("a thread for the terminal: {error}"),
        );
    }
    reply(writer, &Reply::PtyOpened { session: id, pid })
}

/// Reads the terminal into the ring until the command exited and its output is drained.
fn read_terminal(session: &Session, exits: &mpsc::Receiver<WaitStatus>) {
    let mut buffer = vec![0u8; DATA_CHUNK];
    let mut exited: Option<Instant> = None;
    let mut stuck: Option<(u64, Instant)> = None;
    loop {
        if exited.is_none() {
            match exits.recv_timeout(Duration::ZERO) {
                Ok(status) => {
                    exited = Some(Instant::now());
                    session.output().exit = Some(exit_info(status));
                    session.changed.notify_all();
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => exited = Some(Instant::now()),
            }
        }
        if exited.is_some_and(|at| at.elapsed() >= OUTPUT_DRAIN) {
            break;
        }
        if wait_for_holder(session, &mut stuck) {
            // What the program wrote meanwhile is still to be read.
            exited = exited.map(|_| Instant::now());
            continue;
        }
        let mut poll = [rustix::event::PollFd::new(
            &session.master,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        match rustix::event::poll(&mut poll, Some(&timeout)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => break,
        }
        match (&session.master).read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => {
                session.output().push(&buffer[..read]);
                session.changed.notify_all();
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            // EIO: every holder of the terminal's other side has closed it.
            Err(_) if exited.is_some() => break,
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
    let mut output = session.output();
    if output.exit.is_none() {
        output.exit = Some(exit_info_waited(exits));
    }
    output.ended = true;
    drop(output);
    session.changed.notify_all();
}

/// While the holding reader is too far behind: waits a moment for it and says so (`true`);
/// lets it go once it read nothing for [`HOLD_LIMIT`] (`stuck`: where it was and since when).
fn wait_for_holder(session: &Session, stuck: &mut Option<(u64, Instant)>) -> bool {
    let mut output = session.output();
    let Some(held_at) = output.held_at.filter(|_| output.held_back()) else {
        *stuck = None;
        return false;
    };
    let since = match *stuck {
        Some((at, since)) if at == held_at => since,
        _ => stuck.insert((held_at, Instant::now())).1,
    };
    if since.elapsed() >= HOLD_LIMIT {
        output.held_at = None;
        *stuck = None;
        return false;
    }
    drop(
        session
            .changed
            .wait_timeout(output, Duration::from_millis(50))
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    true
}

fn exit_info_waited(exits: &mpsc::Receiver<WaitStatus>) -> ExitInfo {
    exits.recv().map_or(
        ExitInfo {
            code: -1,
            signal: None,
            timed_out: false,
            duration_ms: 0,
        },
        exit_info,
    )
}

fn exit_info(status: WaitStatus) -> ExitInfo {
    let signal = status.terminating_signal();
    ExitInfo {
        code: status
            .exit_status()
            .or_else(|| signal.map(|signal| 128 + signal))
            .unwrap_or(-1),
        signal,
        timed_out: false,
        duration_ms: 0,
    }
}

/// Attaches the connection to a session: `PtyAttached`, then output on one thread and
/// input on another, both of their own, until the session ends or the peer leaves.
pub(crate) fn attach(
    id: u32,
    since: u64,
    hold: bool,
    reader: &UnixStream,
    writer: &Arc<Mutex<UnixStream>>,
) -> io::Result<()> {
    let Some(session) = sessions().get(&id).cloned() else {
        return refuse(writer, "not_found", format!("no terminal session {id}"));
    };
    let (offset, lagged) = {
        let mut output = session.output();
        let (offset, lagged) = if since < output.start {
            (output.start, true)
        } else {
            (since.min(output.end()), false)
        };
        if hold {
            output.held_at = Some(offset);
        }
        (offset, lagged)
    };
    reply(writer, &Reply::PtyAttached { offset, lagged })?;
    let left = Arc::new(AtomicBool::new(false));
    let input = reader.try_clone()?;
    let (pumping, pump_writer, pump_left) =
        (Arc::clone(&session), Arc::clone(writer), Arc::clone(&left));
    thread::Builder::new()
        .name("pty-out".to_owned())
        .stack_size(crate::threads::SMALL_STACK)
        .spawn(move || {
            pump(&pumping, offset, hold, &pump_writer, &pump_left);
            if hold {
                pumping.output().held_at = None;
                pumping.changed.notify_all();
            }
        })?;
    thread::Builder::new()
        .name("pty-in".to_owned())
        .stack_size(crate::threads::SMALL_STACK)
        .spawn(move || {
            feed(&session, input);
            left.store(true, Ordering::SeqCst);
            session.changed.notify_all();
        })?;
    Ok(())
}

/// Output from `offset` to the peer until the session ended (then `Exit` and `End`) or
/// the peer left; a holding peer's progress is kept where the terminal's reader sees it.
fn pump(
    session: &Session,
    mut offset: u64,
    hold: bool,
    writer: &Mutex<UnixStream>,
    left: &AtomicBool,
) {
    loop {
        let mut output = session.output();
        while output.end() == offset && !output.ended && !left.load(Ordering::SeqCst) {
            output = session
                .changed
                .wait(output)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        if left.load(Ordering::SeqCst) {
            return;
        }
        if offset < output.start {
            offset = output.start;
            drop(output);
            if reply(writer, &Reply::PtyLag { offset }).is_err() {
                return;
            }
            continue;
        }
        if output.end() == offset && output.ended {
            let exit = output.exit;
            drop(output);
            if let Some(exit) = exit {
                let _ = reply(writer, &Reply::Exit(exit));
            }
            let _ = write_frame(&mut *lock(writer), FrameKind::End, &[]);
            return;
        }
        let bytes = output.read_from(offset, DATA_CHUNK);
        drop(output);
        offset += bytes.len() as u64;
        if write_frame(&mut *lock(writer), FrameKind::Data, &bytes).is_err() {
            return;
        }
        if hold {
            let mut output = session.output();
            if output.held_at.is_some() {
                output.held_at = Some(offset);
                drop(output);
                session.changed.notify_all();
            }
        }
    }
}

/// Input and resizes from the peer until it leaves (or sends something else).
fn feed(session: &Session, mut input: UnixStream) {
    while let Ok(Some(frame)) = read_frame(&mut input) {
        let fed = match frame.kind {
            FrameKind::Data => (&session.master).write_all(&frame.payload),
            FrameKind::Json => match serde_json::from_slice::<PtyControl>(&frame.payload) {
                Ok(PtyControl::Resize { cols, rows }) => resize(&session.master, cols, rows),
                Err(_) => Ok(()),
            },
            _ => break,
        };
        if fed.is_err() {
            break;
        }
    }
}

/// Signals a session's process group.
pub(crate) fn signal(id: u32, signal: i32, writer: &Mutex<UnixStream>) -> io::Result<()> {
    let Some(session) = sessions().get(&id).cloned() else {
        return refuse(writer, "not_found", format!("no terminal session {id}"));
    };
    let (Some(pid), Some(signal)) = (
        i32::try_from(session.pid).ok().and_then(Pid::from_raw),
        Signal::from_named_raw(signal),
    ) else {
        return refuse(writer, "invalid", format!("signal {signal}"));
    };
    if !session.output().ended {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
    reply(writer, &Reply::Ok(None))
}

/// The helper the agent runs as a session's command: a new session, the terminal on
/// standard input as its controlling terminal, then the command itself (`program`, with
/// `argv`). Returns only when that fails.
pub fn helper(program: &str, argv: &[String]) -> io::Error {
    if let Err(error) = rustix::process::setsid() {
        return error.into();
    }
    if let Err(error) = rustix::process::ioctl_tiocsctty(io::stdin().as_fd()) {
        return error.into();
    }
    let mut command = Command::new(program);
    if let Some((first, rest)) = argv.split_first() {
        command.arg0(first).args(rest);
    }
    command.exec()
}
