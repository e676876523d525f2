//! Code contexts: a Python interpreter per context (`kernel.py`, run with `python3 -c`),
//! kept with the sandbox like a shell session, whose variables and imports live on between
//! calls. A call's code is written to it as one JSON line; its output, rich results and
//! exception come back as JSON lines until `done`. A call runs to its end in a task of its
//! own (the next call must not read the rest of this one); past its timeout it is
//! interrupted (SIGINT: KeyboardInterrupt, the context kept), and a context that does not
//! stop within [`INTERRUPT_GRACE`] after is ended.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sandbase_agent::protocol::{ExitInfo, Request};
use sandbase_api::code::{CodeContext as ContextInfo, CodeDone, CodeEvent};
use sandbase_api::sandboxes::RunAs;
use serde_json::Value;

use crate::agent_client::{AgentClient, ExecEvent, Stdin};
use crate::background::Background;

/// The interpreter's program.
pub const KERNEL: &str = include_str!("kernel.py");
/// Most contexts a sandbox keeps (each holds one of the agent's connections).
pub const MAX_CONTEXTS: usize = 4;
/// How long a call may run when it names no timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long interrupted code has to stop before its context is ended.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

pub type EventReceiver = tokio::sync::mpsc::Receiver<anyhow::Result<ExecEvent>>;

/// A context: its interpreter and the way to talk to it.
pub struct CodeContext {
    pub id: String,
    pub user: RunAs,
    pub pid: u32,
    pub created_at: DateTime<Utc>,
    io: tokio::sync::Mutex<ContextIo>,
    process: Arc<Background>,
}

impl CodeContext {
    /// A context over a started interpreter: its input, its output events, its process.
    pub fn new(
        id: String,
        user: RunAs,
        stdin: Stdin,
        events: EventReceiver,
        process: Arc<Background>,
    ) -> CodeContext {
        CodeContext {
            id,
            user,
            pid: process.pid,
            created_at: Utc::now(),
            io: tokio::sync::Mutex::new(ContextIo {
                stdin,
                events,
                line: Vec::new(),
                stderr: Vec::new(),
            }),
            process,
        }
    }
}

struct ContextIo {
    stdin: Stdin,
    events: EventReceiver,
    /// Output of the interpreter not yet a whole line.
    line: Vec<u8>,
    /// The end of what the interpreter itself wrote on stderr (why it died).
    stderr: Vec<u8>,
}

impl CodeContext {
    pub fn describe(&self) -> ContextInfo {
        ContextInfo {
            id: self.id.clone(),
            user: self.user,
            pid: self.pid,
            created_at: self.created_at,
        }
    }

    pub fn running(&self) -> bool {
        self.process.running()
    }

    /// Runs `code`, every event to `sink`, `done` last; an error when the interpreter died.
    pub async fn run(
        &self,
        agent: &AgentClient,
        code: &str,
        timeout: Duration,
        sink: &mut (dyn FnMut(CodeEvent) + Send),
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut io = self.io.lock().await;
        let mut request = serde_json::to_vec(&serde_json::json!({ "code": code }))?;
        request.push(b'\n');
        io.stdin.write(&request).await?;
        let mut deadline = started + timeout;
        let mut interrupted = false;
        loop {
            let next = tokio::time::timeout_at(deadline.into(), io.events.recv()).await;
            let bytes = match next {
                Err(_) if !interrupted => {
                    interrupted = true;
                    deadline = Instant::now() + INTERRUPT_GRACE;
                    self.signal(agent, 2).await;
                    continue;
                }
                Err(_) => {
                    self.signal(agent, 9).await;
                    self.ended();
                    anyhow::bail!("the code did not stop when interrupted; its context was ended");
                }
                Ok(Some(Ok(ExecEvent::Stdout(bytes)))) => bytes,
                Ok(Some(Ok(ExecEvent::Stderr(bytes)))) => {
                    io.stderr.extend_from_slice(&bytes);
                    let excess = io.stderr.len().saturating_sub(4096);
                    io.stderr.drain(..excess);
                    continue;
                }
                Ok(Some(Ok(ExecEvent::Started { .. }))) => continue,
                Ok(Some(Ok(ExecEvent::Exit(_)) | Err(_)) | None) => {
                    self.ended();
                    let said = String::from_utf8_lossy(&io.stderr).trim().to_owned();
                    anyhow::bail!("the context's interpreter exited: {said}");
                }
            };
            io.line.extend_from_slice(&bytes);
            while let Some(end) = io.line.iter().position(|byte| *byte == b'\n') {
                let line: Vec<u8> = io.line.drain(..=end).collect();
                let Ok(message) = serde_json::from_slice::<Value>(&line) else {
                    continue;
                };
                if let Some(done) = message.get("done") {
                    sink(CodeEvent::Done {
                        done: CodeDone {
                            execution_count: done["count"].as_u64().unwrap_or_default(),
                            duration_ms: started.elapsed().as_millis() as u64,
                            timed_out: interrupted,
                        },
                    });
                    return Ok(());
                }
                if let Ok(event) = serde_json::from_value::<CodeEvent>(message) {
                    sink(event);
                }
            }
        }
    }

    async fn signal(&self, agent: &AgentClient, signal: i32) {
        let request = Request::Signal {
            pid: self.pid,
            signal,
        };
        if let Err(error) = agent.simple(&request).await {
            tracing::debug!(error = format!("{error:#}"), "signalling a code context");
        }
    }

    fn ended(&self) {
        self.process.exited(ExitInfo {
            code: -1,
            signal: None,
            timed_out: false,
            duration_ms: 0,
        });
    }

    /// Interrupts what it runs (KeyboardInterrupt; the context lives on).
    pub async fn interrupt(&self, agent: &AgentClient) {
        self.signal(agent, 2).await;
    }

    /// Ends its interpreter.
    pub async fn end(&self, agent: &AgentClient) {
        self.signal(agent, 9).await;
        self.ended();
    }
}

/// The contexts of a hosted sandbox, by id.
pub type Contexts = tokio::sync::Mutex<HashMap<String, Arc<CodeContext>>>;
