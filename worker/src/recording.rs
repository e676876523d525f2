//! Recording terminal sessions as asciicast v2, on the worker (never in the sandbox): a
//! header, then one `[seconds, code, text]` line per event — `o` output, `i` input (unless
//! the session opted out), `r` resize — sent to the gateway in chunks as the session goes
//! (every [`FLUSH_EVERY`] or [`CHUNK_BYTES`]), and its end with the duration and exit code.
//! The gateway keeps the chunks in the artifact store.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use sandbase_api::internal::{NODE_TOKEN_HEADER, RecordingEnd, paths};
use uuid::Uuid;

use crate::utf8::Utf8Carry;

/// A chunk is sent at least this often while there is something to send.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// ... or once it holds this much.
pub const CHUNK_BYTES: usize = 256 * 1024;
/// Most recording bytes a worker holds for the gateway per session while it is away; the
/// oldest events beyond it are dropped and the gap is marked in the recording.
const MAX_PENDING: usize = 16 * 1024 * 1024;
/// The most one chunk carries (well under the gateway's limit for a chunk): a backlog goes
/// out as several chunks cut at line ends, one after another.
const MAX_SEND: usize = 1024 * 1024;

/// Where recordings go: the gateway's internal API, with the worker's credential.
pub struct RecordingSink {
    pub gateway_url: String,
    pub credential: String,
    pub http: reqwest::Client,
}

impl RecordingSink {
    async fn put_chunk(&self, id: Uuid, chunk: u32, bytes: Vec<u8>) -> anyhow::Result<()> {
        let url = format!(
            "{}{}",
            self.gateway_url,
            paths::recording(&id.to_string(), &chunk.to_string())
        );
        let answer = self
            .http
            .put(url)
            .header(NODE_TOKEN_HEADER, &self.credential)
            .body(bytes)
            .send()
            .await
            .context("sending a recording chunk")?;
        anyhow::ensure!(
            answer.status().is_success(),
            "the gateway answered {} to a recording chunk",
            answer.status()
        );
        Ok(())
    }

    /// A command's recording, whole: what it is in a header, the document as the body.
    pub async fn put_whole(
        &self,
        id: Uuid,
        meta: &sandbase_api::internal::CommandRecording,
        cast: Vec<u8>,
    ) -> anyhow::Result<()> {
        let url = format!(
            "{}{}",
            self.gateway_url,
            paths::recording_whole(&id.to_string())
        );
        let answer = self
            .http
            .put(url)
            .header(NODE_TOKEN_HEADER, &self.credential)
            .header(
                sandbase_api::internal::RECORDING_HEADER,
                serde_json::to_string(meta)?,
            )
            .body(cast)
            .send()
            .await
            .context("sending a command's recording")?;
        anyhow::ensure!(
            answer.status().is_success(),
            "the gateway answered {} to a command's recording",
            answer.status()
        );
        Ok(())
    }

    async fn end(&self, id: Uuid, end: RecordingEnd) -> anyhow::Result<()> {
        let url = format!(
            "{}{}",
            self.gateway_url,
            paths::recording(&id.to_string(), "")
        );
        let answer = self
            .http
            .post(url)
            .header(NODE_TOKEN_HEADER, &self.credential)
            .json(&end)
            .send()
            .await
            .context("ending a recording")?;
        anyhow::ensure!(
            answer.status().is_success(),
            "the gateway answered {} to a recording's end",
            answer.status()
        );
        Ok(())
    }
}

#[derive(Default)]
struct Pending {
    lines: Vec<u8>,
    output: Utf8Carry,
    input: Utf8Carry,
    bytes: u64,
    dropped: bool,
}

/// One session's recording.
pub struct Recorder {
    pub id: Uuid,
    started: Instant,
    with_input: bool,
    pending: Mutex<Pending>,
    wake: tokio::sync::Notify,
    /// Told when pending lines were taken to be sent.
    drained: tokio::sync::Notify,
}

impl Recorder {
    /// Starts a recording (its header first) and the task that sends it; the task ends the
    /// recording once `ended` says the session did, with the exit code `exit` gives then.
    pub fn start(
        id: Uuid,
        size: (u16, u16),
        with_input: bool,
        sink: Arc<RecordingSink>,
        ended: tokio::sync::watch::Receiver<bool>,
        exit: impl Fn() -> Option<i32> + Send + 'static,
    ) -> Arc<Recorder> {
        let header = serde_json::json!({
            "version": 2,
            "width": size.0,
            "height": size.1,
            "timestamp": chrono::Utc::now().timestamp(),
            "env": { "TERM": "xterm-256color" },
        });
        let recorder = Arc::new(Recorder {
            id,
            started: Instant::now(),
            with_input,
            pending: Mutex::new(Pending {
                lines: format!("{header}\n").into_bytes(),
                ..Pending::default()
            }),
            wake: tokio::sync::Notify::new(),
            drained: tokio::sync::Notify::new(),
        });
        tokio::spawn(send(Arc::clone(&recorder), sink, ended, exit));
        recorder
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn event(&self, pending: &mut Pending, code: &str, text: &str) {
        if text.is_empty() {
            return;
        }
        if pending.lines.len() > MAX_PENDING {
            pending.dropped = true;
            return;
        }
        let seconds = self.started.elapsed().as_secs_f64();
        let line = serde_json::json!([seconds, code, text]);
        pending.lines.extend_from_slice(line.to_string().as_bytes());
        pending.lines.push(b'\n');
        if pending.lines.len() >= CHUNK_BYTES {
            self.wake.notify_one();
        }
    }

    /// Waits while more than [`MAX_PENDING`] is waiting to be sent: the terminal's output
    /// is then held back (the agent waits for the worker's reader) rather than lost.
    pub async fn room(&self) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.pending().lines.len() <= MAX_PENDING {
                return;
            }
            self.wake.notify_one();
            drained.await;
        }
    }

    pub fn output(&self, bytes: &[u8]) {
        let mut pending = self.pending();
        let text = pending.output.push(bytes);
        self.event(&mut pending, "o", &text);
    }

    pub fn input(&self, bytes: &[u8]) {
        if !self.with_input {
            return;
        }
        let mut pending = self.pending();
        let text = pending.input.push(bytes);
        self.event(&mut pending, "i", &text);
    }

    pub fn resize(&self, cols: u16, rows: u16) {
        let mut pending = self.pending();
        self.event(&mut pending, "r", &format!("{cols}x{rows}"));
    }

    /// What is waiting to be sent, at most [`MAX_SEND`] cut at a line end (the end: with
    /// what the carries still hold), and whether more is waiting.
    fn take(&self, last: bool) -> (Vec<u8>, bool) {
        let mut pending = self.pending();
        if last {
            let (output, input) = (pending.output.finish(), pending.input.finish());
            self.event(&mut pending, "o", &output);
            if self.with_input {
                self.event(&mut pending, "i", &input);
            }
        }
        if std::mem::take(&mut pending.dropped) {
            let note = "\r\n[sandbase: part of this recording was lost]\r\n";
            let line = serde_json::json!([self.started.elapsed().as_secs_f64(), "o", note]);
            pending
                .lines
                .extend_from_slice(format!("{line}\n").as_bytes());
        }
        let cut = cut_at_line_end(&pending.lines, MAX_SEND);
        let rest = pending.lines.split_off(cut);
        let lines = std::mem::replace(&mut pending.lines, rest);
        pending.bytes += lines.len() as u64;
        self.drained.notify_waiters();
        (lines, !pending.lines.is_empty())
    }
}

/// Where to cut `lines` for a chunk of at most `limit` bytes: after the last whole line that
/// fits (after the first line when even that one does not).
fn cut_at_line_end(lines: &[u8], limit: usize) -> usize {
    if lines.len() <= limit {
        return lines.len();
    }
    let end = |index: usize| index + 1;
    lines[..limit]
        .iter()
        .rposition(|byte| *byte == b'\n')
        .or_else(|| lines.iter().position(|byte| *byte == b'\n'))
        .map_or(lines.len(), end)
}

/// Sends the recording's chunks as they fill (retrying a failed one), then its end.
async fn send(
    recorder: Arc<Recorder>,
    sink: Arc<RecordingSink>,
    mut ended: tokio::sync::watch::Receiver<bool>,
    exit: impl Fn() -> Option<i32>,
) {
    let mut chunk = 0u32;
    let mut backlog = false;
    loop {
        let last = *ended.borrow();
        if !last && !backlog {
            tokio::select! {
                _ = tokio::time::sleep(FLUSH_EVERY) => {}
                () = recorder.wake.notified() => {}
                _ = ended.changed() => {}
            }
        }
        let last = *ended.borrow();
        let (bytes, more) = recorder.take(last);
        backlog = more;
        if !bytes.is_empty() {
            let mut attempt = 0;
            while let Err(error) = sink.put_chunk(recorder.id, chunk, bytes.clone()).await {
                attempt += 1;
                if attempt >= 5 {
                    tracing::warn!(id = %recorder.id, error = format!("{error:#}"), "a recording chunk was lost");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
            chunk += 1;
        }
        if last && !backlog {
            let end = RecordingEnd {
                duration_ms: recorder.started.elapsed().as_millis() as u64,
                bytes: recorder.pending().bytes,
                chunks: chunk,
                exit_code: exit(),
            };
            if let Err(error) = sink.end(recorder.id, end).await {
                tracing::warn!(id = %recorder.id, error = format!("{error:#}"), "ending a recording");
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cut_at_line_end;

    #[test]
    fn chunks_are_cut_after_whole_lines() {
        assert_eq!(cut_at_line_end(b"a\nb\n", 10), 4);
        assert_eq!(cut_at_line_end(b"aa\nbb\ncc\n", 7), 6);
        assert_eq!(cut_at_line_end(b"aa\nbb\ncc\n", 6), 6);
        assert_eq!(cut_at_line_end(b"aa\nbb\ncc\n", 5), 3);
        // A line longer than the limit goes whole, in a chunk of its own.
        assert_eq!(cut_at_line_end(b"aaaaaa\nb\n", 3), 7);
        assert_eq!(cut_at_line_end(b"aaaaaa", 3), 6);
    }
}
