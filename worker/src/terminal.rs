//! Terminal sessions of a hosted sandbox. The agent owns each terminal and its output ring;
//! the worker keeps one attachment of its own per session (the control: input and resizes
//! go through it, and reading its output tells how much was printed and when the session
//! ended), and every client that reads output gets an attachment of its own from the offset
//! it asks for, passed through frame for frame.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sandbase_agent::protocol::{ExitInfo, FrameKind, PtyControl, Reply};
use sandbase_api::terminals::Terminal as TerminalInfo;
use tokio::net::unix::OwnedWriteHalf;

use crate::agent_client::{AgentClient, read_frame, write_frame};
use crate::error::NodeError;
use crate::recording::{Recorder, RecordingSink};

/// Terminal sessions a sandbox may have open at once.
pub const MAX_TERMINALS: usize = 4;
/// A session nobody attached to and nobody typed into for this long ends.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// A terminal session of a hosted sandbox, as the worker follows it.
pub struct Terminal {
    pub session: u32,
    pub pid: u32,
    pub command: Vec<String>,
    pub created_at: DateTime<Utc>,
    size: Mutex<(u16, u16)>,
    control: tokio::sync::Mutex<OwnedWriteHalf>,
    output_bytes: AtomicU64,
    exit: Arc<Mutex<Option<ExitInfo>>>,
    ended: tokio::sync::watch::Sender<bool>,
    /// Clients reading its output now.
    attached: AtomicUsize,
    last_active: Mutex<Instant>,
    idle_timeout: Duration,
    /// Its recording, when the worker has somewhere to send it.
    recorder: Option<Arc<Recorder>>,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Terminal {
    /// Its recording's id.
    pub fn recording(&self) -> Option<uuid::Uuid> {
        self.recorder.as_ref().map(|recorder| recorder.id)
    }

    pub fn describe(&self) -> TerminalInfo {
        let (cols, rows) = *locked(&self.size);
        TerminalInfo {
            session_id: self.session,
            pid: self.pid,
            cols,
            rows,
            command: self.command.clone(),
            created_at: self.created_at,
            output_bytes: self.output_bytes.load(Ordering::Relaxed),
            exit_code: locked(&self.exit).map(|exit| exit.code),
        }
    }

    pub fn ended(&self) -> bool {
        *self.ended.borrow()
    }

    fn touch(&self) {
        *locked(&self.last_active) = Instant::now();
    }

    /// Types `bytes` into the terminal.
    pub async fn input(&self, bytes: &[u8]) -> Result<(), NodeError> {
        self.touch();
        if let Some(recorder) = &self.recorder {
            recorder.input(bytes);
        }
        let mut control = self.control.lock().await;
        for chunk in bytes.chunks(64 * 1024) {
            write_frame(&mut *control, FrameKind::Data, chunk).await?;
        }
        Ok(())
    }

    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), NodeError> {
        if cols == 0 || rows == 0 || cols > 1000 || rows > 1000 {
            return Err(NodeError::Invalid(
                "`cols` and `rows`: from 1 to 1000".to_owned(),
            ));
        }
        *locked(&self.size) = (cols, rows);
        if let Some(recorder) = &self.recorder {
            recorder.resize(cols, rows);
        }
        let control = serde_json::to_vec(&PtyControl::Resize { cols, rows })
            .map_err(|error| NodeError::Internal(error.into()))?;
        write_frame(&mut *self.control.lock().await, FrameKind::Json, &control).await?;
        Ok(())
    }

    /// Counts a client reading output until the guard is dropped.
    pub fn attach_guard(self: &Arc<Self>) -> Attached {
        self.attached.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Attached(Arc::clone(self))
    }

    /// Waits until the session ended, for at most `limit`; whether it did.
    pub async fn wait_ended(&self, limit: Duration) -> bool {
        let mut ended = self.ended.subscribe();
        tokio::time::timeout(limit, ended.wait_for(|ended| *ended))
            .await
            .is_ok()
    }
}

/// What a new terminal is.
pub struct Opened {
    pub session: u32,
    pub pid: u32,
    pub command: Vec<String>,
    pub cols: u16,
    pub rows: u16,
    pub idle_timeout: Option<Duration>,
    /// The recording to write (its id, whether input is recorded) and where it goes.
    pub recording: Option<(uuid::Uuid, bool, Arc<RecordingSink>)>,
}

impl Terminal {
    /// Takes the worker's own attachment to an opened session and follows its output.
    pub async fn start(agent: &AgentClient, opened: Opened) -> Result<Arc<Terminal>, NodeError> {
        // The recording must not miss output: the agent waits for this reader.
        let hold = opened.recording.is_some();
        let (stream, _) = agent.pty_attach(opened.session, 0, hold).await?;
        let (mut reader, writer) = stream.into_split();
        let (ended, _) = tokio::sync::watch::channel(false);
        let exit = Arc::new(Mutex::new(None));
        let recorder = opened.recording.map(|(id, with_input, sink)| {
            let exit = Arc::clone(&exit);
            Recorder::start(
                id,
                (opened.cols, opened.rows),
                with_input,
                sink,
                ended.subscribe(),
                move || locked(&exit).map(|exit: ExitInfo| exit.code),
            )
        });
        let terminal = Arc::new(Terminal {
            session: opened.session,
            pid: opened.pid,
            command: opened.command,
            created_at: Utc::now(),
            size: Mutex::new((opened.cols, opened.rows)),
            control: tokio::sync::Mutex::new(writer),
            output_bytes: AtomicU64::new(0),
            exit,
            ended,
            attached: AtomicUsize::new(0),
            last_active: Mutex::new(Instant::now()),
            idle_timeout: opened.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
            recorder,
        });
        let following = Arc::clone(&terminal);
        tokio::spawn(async move {
            while let Ok(Some((kind, payload))) = read_frame(&mut reader).await {
                match kind {
                    FrameKind::Data => {
                        following
                            .output_bytes
                            .fetch_add(payload.len() as u64, Ordering::Relaxed);
                        if let Some(recorder) = &following.recorder {
                            recorder.room().await;
                            recorder.output(&payload);
                        }
                    }
                    FrameKind::Json => {
                        if let Ok(Reply::Exit(exit)) = serde_json::from_slice(&payload) {
                            *locked(&following.exit) = Some(exit);
                        }
                    }
                    _ => break,
                }
            }
            following.ended.send_replace(true);
        });
        Ok(terminal)
    }

    /// Whether nobody is attached and nothing was typed for its idle timeout.
    pub fn idle(&self) -> bool {
        self.attached.load(Ordering::SeqCst) == 0
            && locked(&self.last_active).elapsed() >= self.idle_timeout
    }

    /// How often to look whether it is idle.
    pub fn idle_check(&self) -> Duration {
        (self.idle_timeout / 4).clamp(Duration::from_millis(250), Duration::from_secs(30))
    }
}

/// A client reading a terminal's output.
pub struct Attached(Arc<Terminal>);

impl Drop for Attached {
    fn drop(&mut self) {
        self.0.touch();
        self.0.attached.fetch_sub(1, Ordering::SeqCst);
    }
}
