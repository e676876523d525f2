//! The agent's server: one thread per connection, one reaper for every child.
//!
//! As PID 1 the agent inherits every orphan in the sandbox, so it must reap them all; it
//! is also the parent of every process it starts and needs their exit statuses. One
//! reaper thread is the only caller of `wait`: it hands statuses of processes the agent
//! started to whoever waits for them, and simply reaps the rest. A process that exits
//! before its starter registered it is kept in `early` until it does.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus};

use crate::protocol::{
    AgentError, Entry, ExecRequest, ExitInfo, FrameKind, Owner, Reply, Request, Stat, read_frame,
    read_json, write_frame, write_json,
};

/// How long output may keep flowing after the process exited (from children it left
/// running with the same pipes) before the exit is reported anyway.
const OUTPUT_DRAIN: Duration = Duration::from_millis(250);
/// The OOM score adjustment of every process the agent starts.
const COMMAND_OOM_SCORE_ADJ: &str = "500";
/// How often a running process is checked for exit and timeout between output.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Connections served at once. The threads exist before any user process does: a sandbox
/// that exhausts its pids limit cannot stop the agent from answering (threads count as
/// pids too).
const CONNECTION_THREADS: usize = 16;

/// Binds `socket` (mode 0600: only the agent's own user may connect) and serves forever.
pub fn run(socket: &Path) -> io::Result<()> {
    let _ = fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    fs::set_permissions(socket, fs::Permissions::from_mode(0o600))?;
    thread::Builder::new()
        .name("reaper".to_owned())
        .spawn(reap_forever)?;
    let mut workers = Vec::new();
    for _ in 0..CONNECTION_THREADS {
        let listener = listener.try_clone()?;
        workers.push(
            thread::Builder::new()
                .name("connection".to_owned())
                .spawn(move || {
                    for connection in listener.incoming() {
                        match connection {
                            Ok(stream) => {
                                let _ = serve(stream);
                            }
                            Err(error) => eprintln!("sandbase-agent: accept failed: {error}"),
                        }
                    }
                })?,
        );
    }
    for worker in workers {
        let _ = worker.join();
    }
    Ok(())
}

#[derive(Default)]
struct Children {
    waiting: HashMap<u32, Sender<WaitStatus>>,
    early: HashMap<u32, WaitStatus>,
}

fn children() -> MutexGuard<'static, Children> {
    static CHILDREN: OnceLock<Mutex<Children>> = OnceLock::new();
    CHILDREN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Counts spawns, so the reaper can sleep while there is nothing to reap.
fn spawns() -> &'static (Mutex<u64>, Condvar) {
    static SPAWNS: OnceLock<(Mutex<u64>, Condvar)> = OnceLock::new();
    SPAWNS.get_or_init(|| (Mutex::new(0), Condvar::new()))
}

fn reap_forever() {
    let (count, wakeup) = spawns();
    loop {
        // Read before waiting: a spawn after this point makes the sleep below end at once.
        let seen = *count
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) => {
                let pid = pid.as_raw_nonzero().get() as u32;
                let mut children = children();
                match children.waiting.remove(&pid) {
                    Some(sender) => {
                        let _ = sender.send(status);
                    }
                    None => {
                        // Either an orphan (nobody waits) or a child whose starter has not
                        // registered yet; keep a bounded memory of the latter.
                        if children.early.len() > 10_000 {
                            children.early.clear();
                        }
                        children.early.insert(pid, status);
                    }
                }
            }
            Ok(None) => {}
            // No children: sleep until the next spawn.
            Err(_) => {
                let guard = count
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let _ =
                    wakeup.wait_timeout_while(guard, Duration::from_secs(1), |now| *now == seen);
            }
        }
    }
}

fn serve(stream: UnixStream) -> io::Result<()> {
    let mut reader = stream.try_clone()?;
    let writer = Arc::new(Mutex::new(stream));
    let request: Request = read_json(&mut reader)?;
    match request {
        Request::Ping => reply(&writer, &Reply::Ok(None)),
        Request::Exec(exec_request) => exec(exec_request, &mut reader, &writer),
        Request::ReadFile { path } => read_file(&path, &writer),
        Request::WriteFile { path, mode, owner } => {
            write_file(&path, mode, owner, &mut reader, &writer)
        }
        Request::List { path } => list(&path, &writer),
        Request::Stat { path } => match stat(Path::new(&path)) {
            Ok(stat) => reply(&writer, &Reply::Ok(Some(stat))),
            Err(error) => reply_error(&writer, &error, &path),
        },
        Request::Mkdir { path, owner } => match mkdir(Path::new(&path), owner) {
            Ok(()) => reply(&writer, &Reply::Ok(stat(Path::new(&path)).ok())),
            Err(error) => reply_error(&writer, &error, &path),
        },
        Request::Remove { path, recursive } => {
            let target = Path::new(&path);
            let result = match fs::symlink_metadata(target) {
                Ok(metadata) if metadata.is_dir() && recursive => fs::remove_dir_all(target),
                Ok(metadata) if metadata.is_dir() => fs::remove_dir(target),
                Ok(_) => fs::remove_file(target),
                Err(error) => Err(error),
            };
            match result {
                Ok(()) => reply(&writer, &Reply::Ok(None)),
                Err(error) => reply_error(&writer, &error, &path),
            }
        }
        Request::Rename { from, to } => match fs::rename(&from, &to) {
            Ok(()) => reply(&writer, &Reply::Ok(stat(Path::new(&to)).ok())),
            Err(error) => reply_error(&writer, &error, &from),
        },
        Request::Signal { pid, signal } => signal_group(pid, signal, &writer),
        Request::TarOut { path } => tar_out(&path, &writer),
        Request::TarIn { path, owner } => tar_in(&path, owner, &mut reader, &writer),
    }
}

/// Signals a running process the agent started (and its process group). Any other pid,
/// the agent's own above all, is refused.
fn signal_group(pid: u32, signal: i32, writer: &Mutex<UnixStream>) -> io::Result<()> {
    let started_by_us = pid > 1 && children().waiting.contains_key(&pid);
    let target = i32::try_from(pid).ok().and_then(Pid::from_raw);
    let (Some(target), true) = (target, started_by_us) else {
        return reply(
            writer,
            &Reply::Error(AgentError {
                kind: "not_found".to_owned(),
                message: format!("no running process {pid} started through the agent"),
            }),
        );
    };
    let Some(signal) = Signal::from_named_raw(signal) else {
        return reply(
            writer,
            &Reply::Error(AgentError {
                kind: "invalid".to_owned(),
                message: format!("unknown signal {signal}"),
            }),
        );
    };
    match rustix::process::kill_process_group(target, signal) {
        Ok(()) => reply(writer, &Reply::Ok(None)),
        Err(error) => reply_error(writer, &io::Error::from(error), "signalling"),
    }
}

/// Streams a directory as a tar archive (links archived as links, never followed).
fn tar_out(path: &str, writer: &Mutex<UnixStream>) -> io::Result<()> {
    let root = Path::new(path);
    match fs::metadata(root) {
        Ok(metadata) if metadata.is_dir() => {}
        Ok(_) => {
            let error = io::Error::new(io::ErrorKind::NotADirectory, "not a directory");
            return reply_error(writer, &error, path);
        }
        Err(error) => return reply_error(writer, &error, path),
    }
    reply(writer, &Reply::Ok(stat(root).ok()))?;
    let mut frames = DataWriter {
        writer,
        buffer: Vec::with_capacity(DATA_CHUNK),
    };
    let archived = (|| {
        let mut builder = tar::Builder::new(&mut frames);
        builder.follow_symlinks(false);
        builder.mode(tar::HeaderMode::Complete);
        builder.append_dir_all(".", root)?;
        builder.finish()
    })();
    match archived {
        Ok(()) => {
            frames.flush()?;
            write_frame(&mut *lock(writer), FrameKind::End, &[])
        }
        // Mid-stream, an error frame takes the place of the end marker.
        Err(error) => reply_error(writer, &error, path),
    }
}

/// Unpacks a tar stream into a directory, refusing entries that would land outside it.
fn tar_in(
    path: &str,
    owner: Option<Owner>,
    reader: &mut UnixStream,
    writer: &Mutex<UnixStream>,
) -> io::Result<()> {
    let target = Path::new(path);
    let mut frames = DataReader {
        reader,
        buffer: Vec::new(),
        position: 0,
        ended: false,
    };
    let result = (|| {
        mkdir(target, owner)?;
        let mut archive = tar::Archive::new(&mut frames);
        archive.set_preserve_permissions(true);
        archive.set_preserve_mtime(true);
        archive.set_overwrite(true);
        for entry in archive.entries()? {
            let mut entry = entry?;
            let relative = entry.path()?.into_owned();
            if !entry.unpack_in(target)? {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} leaves the target directory", relative.display()),
                ));
            }
            if let Some(owner) = owner {
                std::os::unix::fs::lchown(
                    target.join(&relative),
                    Some(owner.uid),
                    Some(owner.gid),
                )?;
            }
        }
        Ok(())
    })();
    // Whatever happened, read the upload to its end so the answer is read by the sender.
    let drained = frames.drain();
    match (result, drained) {
        (Ok(()), Ok(())) => reply(writer, &Reply::Ok(stat(target).ok())),
        (Err(error), _) | (Ok(()), Err(error)) => reply_error(writer, &error, path),
    }
}

/// Size of the `Data` frames the agent sends.
const DATA_CHUNK: usize = 256 * 1024;

/// `Write` as a sequence of `Data` frames.
struct DataWriter<'a> {
    writer: &'a Mutex<UnixStream>,
    buffer: Vec<u8>,
}

impl Write for DataWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let room = DATA_CHUNK - self.buffer.len();
        let taken = bytes.len().min(room);
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() == DATA_CHUNK {
            self.flush()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buffer.is_empty() {
            write_frame(&mut *lock(self.writer), FrameKind::Data, &self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }
}

/// `Read` over `Data` frames up to the `End` frame.
struct DataReader<'a> {
    reader: &'a mut UnixStream,
    buffer: Vec<u8>,
    position: usize,
    ended: bool,
}

impl Read for DataReader<'_> {
    fn read(&mut self, into: &mut [u8]) -> io::Result<usize> {
        while self.position == self.buffer.len() {
            if self.ended {
                return Ok(0);
            }
            match read_frame(self.reader)? {
                Some(frame) if frame.kind == FrameKind::Data => {
                    self.buffer = frame.payload;
                    self.position = 0;
                }
                Some(frame) if frame.kind == FrameKind::End => self.ended = true,
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the upload ended before its end marker",
                    ));
                }
            }
        }
        let count = into.len().min(self.buffer.len() - self.position);
        into[..count].copy_from_slice(&self.buffer[self.position..self.position + count]);
        self.position += count;
        Ok(count)
    }
}

impl DataReader<'_> {
    /// Reads and drops what is left of the upload.
    fn drain(&mut self) -> io::Result<()> {
        let mut sink = [0u8; 64 * 1024];
        while self.read(&mut sink)? > 0 {}
        Ok(())
    }
}

fn lock(writer: &Mutex<UnixStream>) -> MutexGuard<'_, UnixStream> {
    writer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn reply(writer: &Mutex<UnixStream>, message: &Reply) -> io::Result<()> {
    write_json(&mut *lock(writer), message)
}

fn reply_error(writer: &Mutex<UnixStream>, error: &io::Error, context: &str) -> io::Result<()> {
    reply(writer, &Reply::Error(AgentError::from_io(error, context)))
}

fn exec(
    request: ExecRequest,
    reader: &mut UnixStream,
    writer: &Arc<Mutex<UnixStream>>,
) -> io::Result<()> {
    let Some(program) = request.argv.first() else {
        return reply(
            writer,
            &Reply::Error(AgentError {
                kind: "invalid".to_owned(),
                message: "empty command".to_owned(),
            }),
        );
    };
    // Resolve the program here: a failed exec in the child would make the standard library
    // wait for that child itself, racing the reaper.
    let search_path = request.env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
    let Some(resolved) = resolve_program(program, search_path, request.cwd.as_deref()) else {
        return reply(
            writer,
            &Reply::Error(AgentError {
                kind: "not_found".to_owned(),
                message: format!("{program}: command not found"),
            }),
        );
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

    let started = Instant::now();
    let (sender, receiver) = mpsc::channel();
    let spawned = {
        // Registration and spawn under one lock: the reaper cannot see the exit first.
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
    {
        let (count, wakeup) = spawns();
        *count
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
        wakeup.notify_all();
    }
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
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
    if let Some(mut stdin) = child.stdin.take() {
        let mut input = reader.try_clone()?;
        let feeder = thread::Builder::new()
            .name("stdin".to_owned())
            .spawn(move || {
                while let Ok(Some(frame)) = read_frame(&mut input) {
                    if frame.kind != FrameKind::Data || stdin.write_all(&frame.payload).is_err() {
                        break;
                    }
                }
                // Dropping `stdin` closes the pipe: the process sees end of input.
            });
        if let Err(error) = feeder {
            kill_group(pid);
            return reply_error(writer, &error, "feeding standard input");
        }
    }
    // The `Child` is never waited on: the reaper owns every exit status.
    drop(child);

    // This connection's thread watches output, exit and timeout together with poll(2):
    // running a command needs no new thread, so it works even when the sandbox has used
    // up its pids.
    let mut outputs = [(stdout, FrameKind::Stdout), (stderr, FrameKind::Stderr)];
    let deadline = request
        .timeout_ms
        .map(|ms| started + Duration::from_millis(ms));
    let mut timed_out = false;
    let mut exited: Option<(WaitStatus, Instant)> = None;
    let mut buffer = vec![0u8; 64 * 1024];
    let status = loop {
        if exited.is_none() {
            match receiver.try_recv() {
                Ok(status) => exited = Some((status, Instant::now())),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    return reply(writer, &lost_track());
                }
            }
        }
        let open = outputs.iter().any(|(pipe, _)| pipe.is_some());
        if let Some((status, at)) = exited
            && (!open || at.elapsed() >= OUTPUT_DRAIN)
        {
            break status;
        }
        if !timed_out
            && exited.is_none()
            && deadline.is_some_and(|deadline| Instant::now() >= deadline)
        {
            timed_out = true;
            kill_group(pid);
        }
        if !open {
            // Output is done; only the exit (or the deadline) is left to wait for.
            let wait = deadline
                .map_or(Duration::from_secs(1), |deadline| {
                    deadline.saturating_duration_since(Instant::now())
                })
                .clamp(Duration::from_millis(1), Duration::from_secs(1));
            match receiver.recv_timeout(wait) {
                Ok(status) => exited = Some((status, Instant::now())),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return reply(writer, &lost_track());
                }
            }
            continue;
        }
        let mut ready = [false; 2];
        {
            let mut fds = Vec::with_capacity(2);
            let mut slots = Vec::with_capacity(2);
            for (index, (pipe, _)) in outputs.iter().enumerate() {
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
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(error) => {
                    return reply_error(writer, &io::Error::from(error), "watching output");
                }
            }
        }
        for (index, (pipe, kind)) in outputs.iter_mut().enumerate() {
            if !ready[index] {
                continue;
            }
            let Some(stream) = pipe.as_mut() else {
                continue;
            };
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => *pipe = None,
                Ok(read) => {
                    if let Err(error) = write_frame(&mut *lock(writer), *kind, &buffer[..read]) {
                        // Nobody is listening any more: the command goes with its caller.
                        kill_group(pid);
                        return Err(error);
                    }
                }
            }
        }
    };
    if timed_out {
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
            timed_out,
            duration_ms: started.elapsed().as_millis() as u64,
        }),
    )
}

/// Finds an executable the way a shell would: as given when it has a `/`, else on `PATH`.
fn resolve_program(
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
fn lost_track() -> Reply {
    Reply::Error(AgentError {
        kind: "io".to_owned(),
        message: "lost track of the process".to_owned(),
    })
}

fn kill_group(pid: u32) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    }
}

fn read_file(path: &str, writer: &Mutex<UnixStream>) -> io::Result<()> {
    let opened = fs::File::open(path).and_then(|file| {
        let metadata = file.metadata()?;
        if metadata.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "is a directory",
            ));
        }
        Ok(file)
    });
    let mut file = match opened {
        Ok(file) => file,
        Err(error) => return reply_error(writer, &error, path),
    };
    reply(writer, &Reply::Ok(stat(Path::new(path)).ok()))?;
    let mut buffer = vec![0u8; 256 * 1024];
    let mut writer = lock(writer);
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        write_frame(&mut *writer, FrameKind::Data, &buffer[..read])?;
    }
    write_frame(&mut *writer, FrameKind::End, &[])
}

fn write_file(
    path: &str,
    mode: Option<u32>,
    owner: Option<Owner>,
    reader: &mut UnixStream,
    writer: &Mutex<UnixStream>,
) -> io::Result<()> {
    let target = Path::new(path);
    let mut upload = DataReader {
        reader,
        buffer: Vec::new(),
        position: 0,
        ended: false,
    };
    let result = (|| {
        if let Some(parent) = target
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
        {
            mkdir(parent, owner)?;
        }
        // The upload goes to a new file beside the target, which replaces the target only
        // once complete: a failed upload leaves the old content.
        let temporary = temporary_beside(target)?;
        let written = (|| {
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temporary)?;
            file.set_permissions(fs::Permissions::from_mode(mode.unwrap_or(0o644) & 0o7777))?;
            if let Some(owner) = owner {
                std::os::unix::fs::fchown(&file, Some(owner.uid), Some(owner.gid))?;
            }
            io::copy(&mut upload, &mut file)?;
            file.sync_all()?;
            if fs::symlink_metadata(target).is_ok_and(|metadata| metadata.is_dir()) {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    "is a directory",
                ));
            }
            fs::rename(&temporary, target)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        written
    })();
    // Read the upload to its end even after a failure, so the sender reads the answer.
    let drained = upload.drain();
    match (result, drained) {
        (Ok(()), Ok(())) => reply(writer, &Reply::Ok(stat(target).ok())),
        (Err(error), _) | (Ok(()), Err(error)) => reply_error(writer, &error, path),
    }
}

/// A name for a new file in `target`'s directory.
fn temporary_beside(target: &Path) -> io::Result<std::path::PathBuf> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(target.with_file_name(format!(".{}.upload-{count}", name.to_string_lossy())))
}

/// Creates `path` and its missing parents, giving the new ones to `owner`.
fn mkdir(path: &Path, owner: Option<Owner>) -> io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        mkdir(parent, owner)?;
    }
    match fs::create_dir(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {
            return Ok(());
        }
        Err(error) => return Err(error),
    }
    if let Some(owner) = owner {
        std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid))?;
    }
    Ok(())
}

fn list(path: &str, writer: &Mutex<UnixStream>) -> io::Result<()> {
    let entries = fs::read_dir(path).and_then(|entries| {
        let mut listing = Vec::new();
        for entry in entries {
            let entry = entry?;
            if let Ok(stat) = stat(&entry.path()) {
                listing.push(Entry {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    stat,
                });
            }
        }
        listing.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(listing)
    });
    match entries {
        Ok(listing) => reply(writer, &Reply::Listing(listing)),
        Err(error) => reply_error(writer, &error, path),
    }
}

/// Describes `path` itself (a symlink is reported as one, with its target).
fn stat(path: &Path) -> io::Result<Stat> {
    let metadata = fs::symlink_metadata(path)?;
    let file_type = metadata.file_type();
    let kind = if file_type.is_symlink() {
        "symlink"
    } else if file_type.is_dir() {
        "dir"
    } else if file_type.is_file() {
        "file"
    } else {
        "other"
    };
    Ok(Stat {
        path: path.to_string_lossy().into_owned(),
        kind: kind.to_owned(),
        size: metadata.size(),
        mode: metadata.mode() & 0o7777,
        uid: metadata.uid(),
        gid: metadata.gid(),
        modified: metadata.mtime(),
        link_target: if file_type.is_symlink() {
            fs::read_link(path)
                .ok()
                .map(|target| target.to_string_lossy().into_owned())
        } else {
            None
        },
    })
}
