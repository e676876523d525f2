//! The agent's server: one thread per connection, one reaper for every child.
//!
//! As PID 1 the agent inherits every orphan in the sandbox, so it must reap them all; it
//! is also the parent of every process it starts and needs their exit statuses. One
//! reaper thread is the only caller of `wait`: it hands statuses of processes the agent
//! started to whoever waits for them, and simply reaps the rest. A process that exits
//! before its starter registered it is kept in `early` until it does.

use std::fs;
use std::io::{self};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;

use rustix::process::{Pid, Signal};

use crate::protocol::{AgentError, Reply, Request, read_json};

use crate::exec::exec;
use crate::files::{Owners, list, mkdir, read_file, stat, tar_in, tar_out, write_file};
use crate::reaper::{children, reap_forever};
use crate::reply::{reply, reply_error};
use crate::threads::{CONNECTION_STACK, SMALL_STACK};

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
        .stack_size(SMALL_STACK)
        .spawn(reap_forever)?;
    let mut workers = Vec::new();
    for _ in 0..CONNECTION_THREADS {
        let listener = listener.try_clone()?;
        workers.push(
            thread::Builder::new()
                .name("connection".to_owned())
                .stack_size(CONNECTION_STACK)
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
        Request::Signal { pid, signal } => signal_group(pid, signal, false, &writer),
        Request::SignalDescendants { pid, signal } => signal_group(pid, signal, true, &writer),
        Request::TarOut { path } => tar_out(&path, &writer),
        Request::TarIn {
            path,
            owner,
            keep_owners,
        } => {
            let owners = if keep_owners {
                Owners::Archived
            } else {
                Owners::Given(owner)
            };
            tar_in(&path, owners, &mut reader, &writer)
        }
        Request::PtyOpen(request) => crate::pty::open(request, &writer),
        Request::PtyAttach {
            session,
            since,
            hold,
        } => crate::pty::attach(session, since, hold, &reader, &writer),
        Request::PtySignal { session, signal } => crate::pty::signal(session, signal, &writer),
    }
}

/// Signals a running process the agent started (and its process group), or only the
/// processes descended from it. Any other pid, the agent's own above all, is refused.
fn signal_group(
    pid: u32,
    signal: i32,
    descendants: bool,
    writer: &Mutex<UnixStream>,
) -> io::Result<()> {
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
    if descendants {
        for descendant in crate::descendants::of(pid) {
            if let Some(target) = i32::try_from(descendant).ok().and_then(Pid::from_raw) {
                // One may have exited since the scan: nothing to signal then.
                let _ = rustix::process::kill_process(target, signal);
            }
        }
        return reply(writer, &Reply::Ok(None));
    }
    match rustix::process::kill_process_group(target, signal) {
        Ok(()) => reply(writer, &Reply::Ok(None)),
        Err(error) => reply_error(writer, &io::Error::from(error), "signalling"),
    }
}
