//! Shell sessions: a persistent bash per name in a sandbox, for agents' "bash tool". Each
//! command runs in that shell, so `cd` and `export` carry over to the next, and still
//! answers with its own exit code, stdout and stderr.
//!
//! A command is handed to the shell as a quoted here-document `eval`ed in the shell itself
//! (a syntax error is the command's, not the session's), its input closed, followed by two
//! markers — one on stdout with the exit status, one on stderr — that end its output. The
//! markers carry a random nonce drawn for that command, so nothing the sandbox printed
//! before can end a later command's output. `exit` ends the session (the command's exit
//! code is the shell's); a timeout kills the session's processes. The session is one of the
//! sandbox's background processes (listed, counted against their cap, signalled like them).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbase_agent::protocol::ExitInfo;
use sandbase_api::internal::Exec;
use sandbase_api::sandboxes::{ExecResult, RunAs};
use tokio::sync::mpsc;

use crate::agent_client::{ExecEvent, Stdin};
use crate::background::{Background, Stream};

/// Most sessions a sandbox keeps at once (each holds one of the agent's connections, like a
/// background process, and counts against their cap).
pub const MAX_SESSIONS: usize = 4;
/// Longest session name.
pub const MAX_NAME: usize = 64;
/// How long a command may run when it names no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
const SIGKILL: i32 = 9;

/// A persistent shell.
pub struct ShellSession {
    user: RunAs,
    /// Its shell's process.
    pid: u32,
    io: tokio::sync::Mutex<SessionIo>,
}

/// Where a command's output goes as it comes (a named command's ring), before the
/// command ends.
pub type Sink<'a> = &'a mut (dyn FnMut(Stream, &[u8]) + Send);

/// Passes a command's output on as it comes, less its markers: the end of each stream
/// that could still begin its marker is held back until more comes or the command ends.
struct Emitter<'a> {
    sink: Sink<'a>,
    pending: [Vec<u8>; 2],
    done: [bool; 2],
    needles: [Vec<u8>; 2],
}

impl<'a> Emitter<'a> {
    fn new(sink: Sink<'a>, marker: &str) -> Emitter<'a> {
        Emitter {
            sink,
            pending: [Vec::new(), Vec::new()],
            done: [false; 2],
            needles: [
                format!("\n{marker} ").into_bytes(),
                format!("\n{marker}\n").into_bytes(),
            ],
        }
    }

    fn push(&mut self, stream: Stream, bytes: &[u8]) {
        let index = match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        };
        if self.done[index] {
            return;
        }
        let pending = &mut self.pending[index];
        pending.extend_from_slice(bytes);
        if let Some(at) = find(pending, &self.needles[index]) {
            (self.sink)(stream, &pending[..at]);
            pending.clear();
            self.done[index] = true;
            return;
        }
        // Held back: the longest end that begins the needle (a newline, most often).
        let needle = &self.needles[index];
        let hold = (1..needle.len().min(pending.len() + 1))
            .rev()
            .find(|length| pending.ends_with(&needle[..*length]))
            .unwrap_or(0);
        let ready = pending.len() - hold;
        if ready > 0 {
            (self.sink)(stream, &pending[..ready]);
            pending.drain(..ready);
        }
    }

    /// The command ended without its markers (its shell exited, or it timed out).
    fn flush(&mut self) {
        for (index, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
            if !self.done[index] && !self.pending[index].is_empty() {
                (self.sink)(stream, &self.pending[index]);
                self.pending[index].clear();
            }
        }
    }
}

struct SessionIo {
    stdin: Stdin,
    events: mpsc::Receiver<anyhow::Result<ExecEvent>>,
    process: Arc<Background>,
}

/// What a command printed, until its markers.
#[derive(Default)]
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
}

impl Output {
    fn append(&mut self, stream: Stream, bytes: &[u8], limit: usize) {
        let into = match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        // The markers are looked for at the end: keep what may hold them even past the
        // limit, and cut the output itself when the command ends.
        into.extend_from_slice(bytes);
        if into.len() > limit + 4096 {
            let excess = into.len() - (limit + 4096);
            into.drain(limit..limit + excess);
            self.truncated = true;
        }
    }
}

/// Checks a session name: 1 to 64 letters, digits, `-`, `_` or `.`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// The text handed to the shell for `command` (with the working directory and environment
/// the request asks for first), ended by the markers of `nonce`.
fn script(command: &str, cwd: Option<&str>, env: &BTreeMap<String, String>, nonce: &str) -> String {
    let mut text = String::new();
    if let Some(cwd) = cwd {
        text.push_str(&format!("cd -- {} || true\n", quote(cwd)));
    }
    for (key, value) in env {
        text.push_str(&format!("export {key}={}\n", quote(value)));
    }
    // The command is checked by a parse of its own first (`sh -n`): in a POSIX shell a
    // syntax error inside `eval` would end the session's shell itself.
    let delimiter = format!("SANDBASE_COMMAND_{nonce}");
    text.push_str(&format!(
        "__sandbase_command=$(cat <<'{delimiter}'\n{command}\n{delimiter}\n)\n\
         if printf '%s\\n' \"$__sandbase_command\" | ${{BASH:-/bin/sh}} -n 2>/dev/null; then \
         eval \"$__sandbase_command\" </dev/null; \
         else printf '%s\\n' \"$__sandbase_command\" | ${{BASH:-/bin/sh}} -n; (exit 2); fi\n\
         printf '\\n%s %d\\n' '{marker}' \"$?\"\n\
         printf '\\n%s\\n' '{marker}' >&2\n",
        marker = marker(nonce)
    ));
    text
}

fn marker(nonce: &str) -> String {
    format!("SANDBASE_END_{nonce}")
}

/// `text` in single quotes for the shell.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The command line of `argv`: a `sh -c` line as it is, a program and its arguments quoted.
fn command_text(argv: &[String]) -> String {
    match argv {
        [shell, flag, line] if shell == "/bin/sh" && flag == "-c" => line.clone(),
        _ => argv
            .iter()
            .map(|arg| quote(arg))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The command's exit status when `stdout` ends with its marker line; the output before it.
fn finished_stdout(stdout: &[u8], marker: &str) -> Option<(usize, i32)> {
    let needle = format!("\n{marker} ");
    let at = find(stdout, needle.as_bytes())?;
    let rest = &stdout[at + needle.len()..];
    let end = rest.iter().position(|b| *b == b'\n')?;
    let code = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some((at, code))
}

fn finished_stderr(stderr: &[u8], marker: &str) -> Option<usize> {
    find(stderr, format!("\n{marker}\n").as_bytes())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

impl ShellSession {
    /// A session over a started shell: its input, its output events, its process entry.
    pub fn new(
        user: RunAs,
        stdin: Stdin,
        events: mpsc::Receiver<anyhow::Result<ExecEvent>>,
        process: Arc<Background>,
    ) -> ShellSession {
        ShellSession {
            user,
            pid: process.pid,
            io: tokio::sync::Mutex::new(SessionIo {
                stdin,
                events,
                process,
            }),
        }
    }

    pub fn user(&self) -> RunAs {
        self.user
    }

    /// Its shell's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether its shell still runs. What it printed between commands (a background child's
    /// output) is dropped here; an exit seen here (a signal through `/processes`) ends it.
    pub async fn running(&self) -> bool {
        let mut io = self.io.lock().await;
        loop {
            match io.events.try_recv() {
                Ok(Ok(ExecEvent::Exit(exit))) => {
                    io.process.exited(exit);
                    return false;
                }
                Ok(Ok(_)) => {}
                Err(mpsc::error::TryRecvError::Empty) => return io.process.running(),
                Ok(Err(_)) | Err(mpsc::error::TryRecvError::Disconnected) => {
                    io.process.exited(ExitInfo {
                        code: -1,
                        signal: None,
                        timed_out: false,
                        duration_ms: 0,
                    });
                    return false;
                }
            }
        }
    }

    /// Marks its process ended (it exited, or is being killed).
    pub async fn end(&self) {
        self.io.lock().await.process.exited(ExitInfo {
            code: -1,
            signal: None,
            timed_out: false,
            duration_ms: 0,
        });
    }

    /// Runs `exec`'s command in the shell (one at a time) and answers with its result; its
    /// output also goes to `sink` as it comes, when one is given.
    pub async fn run(
        &self,
        exec: &Exec,
        output_limit: usize,
        sink: Option<Sink<'_>>,
    ) -> anyhow::Result<Ran> {
        let command = command_text(&exec.argv);
        let started = Instant::now();
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let mut io = self.io.lock().await;
        let text = script(&command, exec.cwd.as_deref(), &exec.env, &nonce);
        io.stdin.write(text.as_bytes()).await?;
        let timeout = exec
            .timeout_ms
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        let marker = marker(&nonce);
        let mut emitter = sink.map(|sink| Emitter::new(sink, &marker));
        let done = io
            .until_done(&marker, started + timeout, output_limit, emitter.as_mut())
            .await;
        if let Some(emitter) = &mut emitter {
            emitter.flush();
        }
        Ok(match done {
            Done::Finished { mut output, code } => {
                Ran::Finished(result(&mut output, code, None, started))
            }
            Done::Exited { mut output, exit } => {
                Ran::Ended(result(&mut output, exit.code, exit.signal, started))
            }
            Done::TimedOut { mut output } => {
                let mut answer = result(&mut output, 128 + SIGKILL, Some(SIGKILL), started);
                answer.timed_out = true;
                Ran::TimedOut {
                    result: answer,
                    pid: io.process.pid,
                }
            }
        })
    }
}

/// How a session command ended.
pub enum Ran {
    /// It finished; the session goes on.
    Finished(ExecResult),
    /// The shell exited with it (`exit`): the session is over.
    Ended(ExecResult),
    /// It ran out of time: the session's processes (`pid`'s group) are to be killed.
    TimedOut { result: ExecResult, pid: u32 },
}

/// The signal a timed-out session's processes get.
pub const KILL: i32 = SIGKILL;

enum Done {
    Finished { output: Output, code: i32 },
    Exited { output: Output, exit: ExitInfo },
    TimedOut { output: Output },
}

impl SessionIo {
    /// Reads the shell's output until both markers of this command arrived, the shell
    /// exited, or `deadline` passed.
    async fn until_done(
        &mut self,
        marker: &str,
        deadline: Instant,
        limit: usize,
        mut emitter: Option<&mut Emitter<'_>>,
    ) -> Done {
        let mut output = Output::default();
        let mut code = None;
        let mut stderr_done = false;
        loop {
            if code.is_none()
                && let Some((at, status)) = finished_stdout(&output.stdout, marker)
            {
                output.stdout.truncate(at);
                code = Some(status);
            }
            if !stderr_done && let Some(at) = finished_stderr(&output.stderr, marker) {
                output.stderr.truncate(at);
                stderr_done = true;
            }
            if let (Some(code), true) = (code, stderr_done) {
                return Done::Finished { output, code };
            }
            let next = tokio::time::timeout_at(deadline.into(), self.events.recv()).await;
            match next {
                Err(_) => return Done::TimedOut { output },
                Ok(Some(Ok(ExecEvent::Stdout(bytes)))) if code.is_none() => {
                    if let Some(emitter) = emitter.as_deref_mut() {
                        emitter.push(Stream::Stdout, &bytes);
                    }
                    output.append(Stream::Stdout, &bytes, limit);
                }
                Ok(Some(Ok(ExecEvent::Stderr(bytes)))) if !stderr_done => {
                    if let Some(emitter) = emitter.as_deref_mut() {
                        emitter.push(Stream::Stderr, &bytes);
                    }
                    output.append(Stream::Stderr, &bytes, limit);
                }
                Ok(Some(Ok(ExecEvent::Exit(exit)))) => {
                    self.process.exited(exit);
                    return Done::Exited { output, exit };
                }
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(_)) | None) => {
                    let exit = ExitInfo {
                        code: -1,
                        signal: None,
                        timed_out: false,
                        duration_ms: 0,
                    };
                    self.process.exited(exit);
                    return Done::Exited { output, exit };
                }
            }
        }
    }
}

fn result(output: &mut Output, code: i32, signal: Option<i32>, started: Instant) -> ExecResult {
    ExecResult {
        exit_code: code,
        signal,
        timed_out: false,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        truncated: output.truncated,
        duration_ms: started.elapsed().as_millis() as u64,
        exec_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_and_plain() {
        assert!(valid_name("main") && valid_name("agent-1.step_2"));
        for bad in ["", "a b", "x/y", "$(id)", &"n".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_command_ends_only_at_its_own_markers() {
        let nonce = "abc";
        let marker = marker(nonce);
        // An earlier command's marker (another nonce) is output like any other.
        let stdout = format!("x\nSANDBASE_END_old 0\ny\n\n{marker} 3\n");
        let (at, code) = finished_stdout(stdout.as_bytes(), &marker).unwrap();
        assert_eq!((&stdout[..at], code), ("x\nSANDBASE_END_old 0\ny\n", 3));
        assert_eq!(finished_stdout(b"no marker yet", &marker), None);
        let stderr = format!("warn\n\n{marker}\n");
        assert_eq!(finished_stderr(stderr.as_bytes(), &marker), Some(5));
    }

    #[test]
    fn streamed_output_never_carries_the_markers_at_any_split() {
        let marker = marker("n0nce");
        let stdout = format!("line one\nline two\n\n{marker} 0\nlate\n");
        for split in 0..stdout.len() {
            let mut seen = Vec::new();
            let mut sink = |_: Stream, bytes: &[u8]| seen.extend_from_slice(bytes);
            let mut emitter = Emitter::new(&mut sink, &marker);
            emitter.push(Stream::Stdout, &stdout.as_bytes()[..split]);
            emitter.push(Stream::Stdout, &stdout.as_bytes()[split..]);
            emitter.flush();
            assert_eq!(seen, b"line one\nline two\n", "split at {split}");
        }
    }

    #[test]
    fn the_script_quotes_what_it_is_given() {
        let env = BTreeMap::from([("A".to_owned(), "it's".to_owned())]);
        let text = script("echo hi", Some("/tmp/a b"), &env, "n1");
        assert!(
            text.starts_with("cd -- '/tmp/a b' || true\nexport A='it'\\''s'\n"),
            "{text}"
        );
        assert!(text.contains("<<'SANDBASE_COMMAND_n1'\necho hi\nSANDBASE_COMMAND_n1\n)"));
    }
}
