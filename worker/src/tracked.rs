//! Commands a caller named (`exec_id`). Each runs in a task of its own, so it goes on to its
//! end whatever happens to the caller's connection; its output (both streams, in the order
//! they were written, numbered by byte offset) is kept in a ring of [`RING_BYTES`] that any
//! number of readers follow from an offset, while it runs and for [`KEPT_TTL`] after. A
//! second start of the same id answers the first one's command and runs nothing. Cancel
//! interrupts it (SIGINT to its process group, or to a session command's processes with
//! the session's shell left alone) and kills what is left a second later.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sandbase_agent::protocol::ExitInfo;
use sandbase_api::execs::{ExecResult, ExecStatus, OutputChunk, OutputStream};
use tokio::sync::watch;

use crate::background::{OutputBudget, Stream};
use crate::error::NodeError;
use crate::utf8::Utf8Carry;

/// Output kept per named command (the latest bytes).
pub const RING_BYTES: usize = 1 << 20;
/// Named commands running at once in one sandbox (each holds one of the agent's
/// connections, as a background process does).
pub const MAX_RUNNING: usize = 8;
/// Named commands kept per sandbox, running or ended.
pub const MAX_KEPT: usize = 64;
/// How long an ended named command is kept.
pub const KEPT_TTL: Duration = Duration::from_secs(600);
/// How long an interrupted command has before it is killed.
pub const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// What a cancel signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The process group the command leads.
    Group(u32),
    /// The processes below a session's shell (the command it runs), not the shell.
    Descendants(u32),
}

/// A named command: what it is, its output so far, how it ended.
pub struct Tracked {
    pub id: String,
    pub argv: Vec<String>,
    pub session: Option<String>,
    pub started_at: DateTime<Utc>,
    state: Mutex<State>,
    changed: watch::Sender<()>,
    budget: OutputBudget,
}

#[derive(Default)]
struct State {
    pid: Option<u32>,
    target: Option<Target>,
    chunks: VecDeque<OutputChunk>,
    /// Bytes of text in `chunks`.
    kept: usize,
    /// The offset after the last byte written.
    end: u64,
    stdout: Utf8Carry,
    stderr: Utf8Carry,
    exit: Option<ExitInfo>,
    cancelled: bool,
    ended_at: Option<Instant>,
}

/// What a reader finds past its offset.
pub struct Read {
    pub pid: Option<u32>,
    /// Where `chunks` start (past the offset asked when older output was dropped).
    pub offset: u64,
    pub chunks: Vec<OutputChunk>,
    pub next: u64,
    pub exit: Option<ExitInfo>,
}

impl Tracked {
    pub fn new(
        id: String,
        argv: Vec<String>,
        session: Option<String>,
        budget: OutputBudget,
    ) -> Tracked {
        Tracked {
            id,
            argv,
            session,
            started_at: Utc::now(),
            state: Mutex::new(State::default()),
            changed: watch::Sender::new(()),
            budget,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Its process started; a cancel now signals `target`.
    pub fn started(&self, pid: u32, target: Target) {
        let mut state = self.lock();
        state.pid = Some(pid);
        state.target = Some(target);
        drop(state);
        self.changed.send_replace(());
    }

    /// Output on `stream`, kept at the end of the ring (a character split across chunks
    /// waits for its rest).
    pub fn append(&self, stream: Stream, bytes: &[u8]) {
        let mut state = self.lock();
        let text = match stream {
            Stream::Stdout => state.stdout.push(bytes),
            Stream::Stderr => state.stderr.push(bytes),
        };
        self.keep(&mut state, stream, text);
        drop(state);
        self.changed.send_replace(());
    }

    fn keep(&self, state: &mut State, stream: Stream, text: String) {
        if text.is_empty() {
            return;
        }
        let length = text.len();
        // The ring holds its size, within what the sandbox's and the worker's budgets leave.
        let limit = RING_BYTES.min(state.kept + self.budget.room());
        state.chunks.push_back(OutputChunk {
            stream: match stream {
                Stream::Stdout => OutputStream::Stdout,
                Stream::Stderr => OutputStream::Stderr,
            },
            offset: state.end,
            text,
        });
        state.end += length as u64;
        state.kept += length;
        self.budget.add(length);
        while state.kept > limit {
            let Some(front) = state.chunks.front_mut() else {
                break;
            };
            let excess = state.kept - limit;
            let cut = if excess >= front.text.len() {
                front.text.len()
            } else {
                ceil_char_boundary(&front.text, excess)
            };
            if cut == front.text.len() {
                state.chunks.pop_front();
            } else {
                front.text.drain(..cut);
                front.offset += cut as u64;
            }
            state.kept -= cut;
            self.budget.remove(cut);
        }
    }

    /// It ended (the first end counts); what was carried of a split character is written.
    pub fn finish(&self, exit: ExitInfo) {
        let mut state = self.lock();
        if state.exit.is_some() {
            return;
        }
        for stream in [Stream::Stdout, Stream::Stderr] {
            let rest = match stream {
                Stream::Stdout => state.stdout.finish(),
                Stream::Stderr => state.stderr.finish(),
            };
            self.keep(&mut state, stream, rest);
        }
        state.exit = Some(exit);
        state.ended_at = Some(Instant::now());
        drop(state);
        self.changed.send_replace(());
    }

    /// It could not run or its stream broke: `message` on stderr, exit code `code`.
    pub fn fail(&self, code: i32, message: &str, started: Instant) {
        self.append(Stream::Stderr, format!("{message}\n").as_bytes());
        self.finish(ExitInfo {
            code,
            signal: None,
            timed_out: false,
            duration_ms: started.elapsed().as_millis() as u64,
        });
    }

    pub fn running(&self) -> bool {
        self.lock().exit.is_none()
    }

    fn ended_at(&self) -> Option<Instant> {
        self.lock().ended_at
    }

    /// Marks it cancelled; what to signal, while it runs and its process is known.
    pub fn cancel(&self) -> Option<Target> {
        let mut state = self.lock();
        if state.exit.is_some() {
            return None;
        }
        state.cancelled = true;
        state.target
    }

    /// What is kept from `offset` on (from the oldest kept byte when that is later).
    pub fn read(&self, offset: u64) -> Read {
        let state = self.lock();
        let oldest = state.chunks.front().map_or(state.end, |chunk| chunk.offset);
        let offset = offset.clamp(oldest, state.end);
        let mut chunks = Vec::new();
        for chunk in &state.chunks {
            let chunk_end = chunk.offset + chunk.text.len() as u64;
            if chunk_end <= offset {
                continue;
            }
            let skip = offset.saturating_sub(chunk.offset) as usize;
            let skip = ceil_char_boundary(&chunk.text, skip);
            if skip < chunk.text.len() {
                chunks.push(OutputChunk {
                    stream: chunk.stream,
                    offset: chunk.offset + skip as u64,
                    text: chunk.text[skip..].to_owned(),
                });
            }
        }
        Read {
            pid: state.pid,
            offset,
            chunks,
            next: state.end,
            exit: state.exit,
        }
    }

    /// A receiver woken by every change after this call.
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// It and its output from `offset`, as the API shows it.
    pub fn status(&self, offset: u64) -> ExecStatus {
        let read = self.read(offset);
        let cancelled = self.lock().cancelled;
        ExecStatus {
            exec_id: self.id.clone(),
            cmd: self.argv.clone(),
            session: self.session.clone(),
            pid: read.pid,
            running: read.exit.is_none(),
            cancelled,
            exit_code: read.exit.map(|exit| exit.code),
            signal: read.exit.and_then(|exit| exit.signal),
            timed_out: read.exit.is_some_and(|exit| exit.timed_out),
            duration_ms: read.exit.map(|exit| exit.duration_ms),
            started_at: self.started_at,
            offset: read.offset,
            next_offset: read.next,
            output: read.chunks,
        }
    }

    /// Its whole result, once it ended (output dropped from the ring's front is marked
    /// `truncated`).
    pub fn result(&self) -> Option<ExecResult> {
        let read = self.read(0);
        let exit = read.exit?;
        let (mut stdout, mut stderr) = (String::new(), String::new());
        for chunk in &read.chunks {
            match chunk.stream {
                OutputStream::Stdout => stdout.push_str(&chunk.text),
                OutputStream::Stderr => stderr.push_str(&chunk.text),
            }
        }
        Some(ExecResult {
            exit_code: exit.code,
            signal: exit.signal,
            timed_out: exit.timed_out,
            stdout,
            stderr,
            truncated: read.offset > 0,
            duration_ms: exit.duration_ms,
            exec_id: Some(self.id.clone()),
        })
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let kept = self.lock().kept;
        self.budget.remove(kept);
    }
}

/// The first character boundary of `text` at or after `at`.
fn ceil_char_boundary(text: &str, at: usize) -> usize {
    (at..=text.len())
        .find(|index| text.is_char_boundary(*index))
        .unwrap_or(text.len())
}

/// A start of a named command: new (to be run), or the one started before under its id.
pub enum Claim {
    New(Arc<Tracked>),
    Existing(Arc<Tracked>),
}

/// Claims `id` in `kept` for `argv` (in `session`): the command kept under it when it is
/// the same one, else a new entry; another command under a kept id is refused.
pub fn claim(
    kept: &mut HashMap<String, Arc<Tracked>>,
    id: &str,
    argv: &[String],
    session: Option<&str>,
    budget: &OutputBudget,
) -> Result<Claim, NodeError> {
    if let Some(found) = kept.get(id) {
        return if found.argv == argv && found.session.as_deref() == session {
            Ok(Claim::Existing(Arc::clone(found)))
        } else {
            Err(NodeError::ExecIdInUse(id.to_owned()))
        };
    }
    make_room(kept)?;
    let tracked = Arc::new(Tracked::new(
        id.to_owned(),
        argv.to_vec(),
        session.map(str::to_owned),
        budget.clone(),
    ));
    kept.insert(id.to_owned(), Arc::clone(&tracked));
    Ok(Claim::New(tracked))
}

/// Makes room for one more named command: ended ones past their TTL or beyond
/// [`MAX_KEPT`] (the oldest first) are forgotten; refused while [`MAX_RUNNING`] run.
fn make_room(kept: &mut HashMap<String, Arc<Tracked>>) -> Result<(), NodeError> {
    let now = Instant::now();
    kept.retain(|_, tracked| {
        tracked
            .ended_at()
            .is_none_or(|at| now.duration_since(at) < KEPT_TTL)
    });
    let mut ended: Vec<(Instant, String)> = kept
        .values()
        .filter_map(|tracked| tracked.ended_at().map(|at| (at, tracked.id.clone())))
        .collect();
    if ended.len() >= MAX_KEPT {
        ended.sort_unstable();
        for (_, id) in &ended[..=ended.len() - MAX_KEPT] {
            kept.remove(id);
        }
    }
    if kept.values().filter(|tracked| tracked.running()).count() >= MAX_RUNNING {
        return Err(NodeError::TooManyProcesses(MAX_RUNNING));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::background::Retained;

    fn tracked(budget: usize) -> Tracked {
        Tracked::new(
            "x".to_owned(),
            vec![],
            None,
            OutputBudget::new(Retained::new(budget), Retained::new(budget)),
        )
    }

    fn exit() -> ExitInfo {
        ExitInfo {
            code: 0,
            signal: None,
            timed_out: false,
            duration_ms: 1,
        }
    }

    #[test]
    fn output_is_read_from_any_offset_in_write_order() {
        let command = tracked(1 << 30);
        command.append(Stream::Stdout, b"one\n");
        command.append(Stream::Stderr, b"two\n");
        // A character split across chunks is kept whole.
        command.append(Stream::Stdout, &"é".as_bytes()[..1]);
        command.append(Stream::Stdout, &"é".as_bytes()[1..]);
        let all = command.read(0);
        let texts: Vec<_> = all
            .chunks
            .iter()
            .map(|c| (c.offset, c.text.as_str()))
            .collect();
        assert_eq!(texts, [(0, "one\n"), (4, "two\n"), (8, "é")]);
        assert_eq!(all.next, 10);
        let later = command.read(6);
        assert_eq!(later.chunks[0].text, "o\n");
        // Inside a character: from the next one.
        assert_eq!(command.read(9).chunks.len(), 0);
        assert!(command.result().is_none());
        command.finish(exit());
        let result = command.result().expect("ended");
        assert_eq!(
            (result.stdout.as_str(), result.stderr.as_str()),
            ("one\né", "two\n")
        );
        assert!(!result.truncated);
    }

    #[test]
    fn the_ring_keeps_the_latest_mebibyte_and_its_budget() {
        let command = tracked(1 << 30);
        for _ in 0..3 {
            command.append(Stream::Stdout, &vec![b'a'; 700 * 1024]);
        }
        let read = command.read(0);
        let kept: usize = read.chunks.iter().map(|chunk| chunk.text.len()).sum();
        assert_eq!(kept, RING_BYTES);
        assert_eq!(read.offset, 3 * 700 * 1024 - RING_BYTES as u64);
        assert_eq!(read.next, 3 * 700 * 1024);
        // A small budget holds it tighter; dropping it gives the bytes back.
        let worker = Retained::new(1000);
        let small = Tracked::new(
            "y".to_owned(),
            vec![],
            None,
            OutputBudget::new(Retained::new(1000), Arc::clone(&worker)),
        );
        small.append(Stream::Stdout, &[b'b'; 5000]);
        assert_eq!(worker.bytes(), 1000);
        drop(small);
        assert_eq!(worker.bytes(), 0);
    }
}
