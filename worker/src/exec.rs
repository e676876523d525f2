//! What runs in a hosted sandbox: the agent request for a command (environment, working
//! directory, user), background processes with bounded output buffers and open stdin, and
//! shell sessions (`session.rs` runs their commands).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use sandbase_agent::protocol::{ExecRequest, ExitInfo, Owner, Request};
use sandbase_api::internal::Exec;
use sandbase_api::sandboxes::{ExecResult, Process, RunAs};
use uuid::Uuid;

use crate::agent_client::{AgentClient, ExecEvent};
pub use crate::background::Background;
use crate::background::{OutputBudget, Stream};
use crate::runtime::Sandbox;
use crate::session::{Ran, ShellSession};

/// The events of a process the agent runs.
type EventReceiver = tokio::sync::mpsc::Receiver<anyhow::Result<ExecEvent>>;
use crate::spec::{SANDBOX_USER, WORK_DIR};

use crate::error::NodeError;
use crate::network::Attached;

/// A sandbox hosted for the gateway.
pub struct Hosted {
    pub id: Uuid,
    pub sandbox: Sandbox,
    pub agent: AgentClient,
    pub template: String,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) cwd: String,
    pub(crate) processes: Mutex<HashMap<u32, Arc<Background>>>,
    /// Its named commands (`exec_id`), running and recently ended.
    pub(crate) tracked: Mutex<HashMap<String, Arc<crate::tracked::Tracked>>>,
    /// Its code contexts, by id.
    pub(crate) code_contexts: crate::code::Contexts,
    /// Its shell sessions, by name.
    pub(crate) sessions: tokio::sync::Mutex<HashMap<String, Arc<ShellSession>>>,
    /// What its background processes' output may hold of the worker's memory.
    pub(crate) output_budget: OutputBudget,
    /// The memory it reserves on the node (MiB).
    pub(crate) memory_mb: u64,
    pub(crate) cpu_millis: u64,
    pub(crate) meter: crate::usage::Meter,
    /// Its terminal sessions, by the agent's number.
    pub(crate) terminals: Mutex<HashMap<u32, Arc<crate::terminal::Terminal>>>,
    /// Whether it is paused, and its activity (for pausing it when idle).
    pub(crate) pause: crate::pause_state::PauseState,
    /// Its link to the egress proxy, when it has egress.
    pub link: Option<Attached>,
    /// Its network namespace (previews connect inside it).
    pub netns: Option<std::fs::File>,
}

/// The default search path of commands.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub(crate) fn user() -> Owner {
    Owner {
        uid: SANDBOX_USER,
        gid: SANDBOX_USER,
    }
}

impl Hosted {
    /// The agent request for `exec`: the sandbox's environment and working directory under
    /// the command's own, as the sandbox user unless root was asked for.
    pub fn exec_request(&self, exec: &Exec) -> Result<ExecRequest, NodeError> {
        if exec.argv.is_empty() {
            return Err(NodeError::Invalid("the command is empty".to_owned()));
        }
        let (user, home, name) = match exec.user {
            RunAs::User => (Some(user()), WORK_DIR, "user"),
            RunAs::Root => (None, "/root", "root"),
        };
        let mut env: BTreeMap<String, String> = [
            ("PATH", PATH),
            ("HOME", home),
            ("USER", name),
            ("LANG", "C.UTF-8"),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
        env.extend(self.env.clone());
        env.extend(exec.env.clone());
        Ok(ExecRequest {
            argv: exec.argv.clone(),
            env,
            cwd: Some(exec.cwd.clone().unwrap_or_else(|| self.cwd.clone())),
            user,
            timeout_ms: exec.timeout_ms,
            stdin: false,
        })
    }

    /// Starts `exec` in the background with its standard input open.
    pub async fn start_background(
        self: &Arc<Self>,
        exec: &Exec,
        output_limit: usize,
    ) -> Result<u32, NodeError> {
        let request = self.exec_request(exec)?;
        let initial = exec.stdin.clone().map(String::into_bytes);
        let (pid, mut events, stdin) = self.start_kept(request, initial).await?;
        let process = Arc::new(Background::new(
            pid,
            exec.argv.clone(),
            stdin,
            output_limit,
            self.output_budget.clone(),
        ));
        self.lock_processes().insert(pid, Arc::clone(&process));
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                match event {
                    Ok(ExecEvent::Stdout(bytes)) => process.append(Stream::Stdout, &bytes),
                    Ok(ExecEvent::Stderr(bytes)) => process.append(Stream::Stderr, &bytes),
                    Ok(ExecEvent::Exit(exit)) => process.exited(exit),
                    Ok(ExecEvent::Started { .. }) => {}
                    Err(error) => {
                        tracing::debug!(
                            error = format!("{error:#}"),
                            "background process stream ended"
                        );
                        process.exited(ExitInfo {
                            code: -1,
                            signal: None,
                            timed_out: false,
                            duration_ms: 0,
                        });
                    }
                }
            }
            // The command is over: close its input.
            process.stdin.lock().await.take();
        });
        Ok(pid)
    }

    pub fn process(&self, pid: u32) -> Result<Arc<Background>, NodeError> {
        self.lock_processes()
            .get(&pid)
            .cloned()
            .ok_or(NodeError::ProcessNotFound)
    }

    pub fn processes(&self) -> Vec<Arc<Background>> {
        let mut processes: Vec<_> = self.lock_processes().values().cloned().collect();
        processes.sort_by_key(|process| process.started_at);
        processes
    }

    pub(crate) fn lock_processes(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Background>>> {
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Background {
    /// The process as the API shows it, with its output when `with_output`.
    pub fn describe(&self, with_output: bool) -> Process {
        let state = self.lock();
        let text = |bytes: &VecDeque<u8>| {
            if with_output {
                let (front, back) = bytes.as_slices();
                let mut joined = Vec::with_capacity(bytes.len());
                joined.extend_from_slice(front);
                joined.extend_from_slice(back);
                String::from_utf8_lossy(&joined).into_owned()
            } else {
                String::new()
            }
        };
        Process {
            pid: self.pid,
            cmd: self.argv.clone(),
            running: state.exit.is_none(),
            exit_code: state.exit.map(|exit| exit.code),
            started_at: self.started_at,
            stdout: text(&state.stdout),
            stderr: text(&state.stderr),
        }
    }

    /// Writes to the process's standard input; `close` ends it afterwards.
    pub async fn send_stdin(&self, bytes: &[u8], close: bool) -> Result<(), NodeError> {
        let mut stdin = self.stdin.lock().await;
        let Some(open) = stdin.as_mut() else {
            return Err(NodeError::StdinClosed);
        };
        if !bytes.is_empty() {
            open.write(bytes).await?;
        }
        if close && let Some(open) = stdin.take() {
            open.close().await?;
        }
        Ok(())
    }
}

impl Hosted {
    /// Starts a process that stays with the sandbox (a background process, a session's
    /// shell), room made for it among the background processes, its input kept open;
    /// answers once it started.
    pub(crate) async fn start_kept(
        &self,
        request: ExecRequest,
        initial: Option<Vec<u8>>,
    ) -> Result<(u32, EventReceiver, Option<crate::agent_client::Stdin>), NodeError> {
        crate::background::make_room(&mut self.lock_processes())?;
        let (mut events, stdin) = self.agent.start(request, initial, true).await?;
        match events.recv().await {
            Some(Ok(ExecEvent::Started { pid })) => Ok((pid, events, stdin)),
            Some(Err(error)) => Err(error.into()),
            other => Err(NodeError::Internal(anyhow::anyhow!(
                "unexpected first event {other:?}"
            ))),
        }
    }

    /// Runs `exec`'s command in shell session `name` (started on first use) and answers
    /// with its own result; `exit` or a timeout ends the session.
    pub async fn run_in_session(
        self: &Arc<Self>,
        name: &str,
        exec: &Exec,
        output_limit: usize,
    ) -> Result<ExecResult, NodeError> {
        let session = self.session_for(name, exec).await?;
        self.run_in(name, &session, exec, output_limit, None).await
    }

    /// Session `name` for `exec` (started on first use); refused when it runs as the other
    /// user.
    pub async fn session_for(
        &self,
        name: &str,
        exec: &Exec,
    ) -> Result<Arc<ShellSession>, NodeError> {
        let session = self.session(name, exec).await?;
        if session.user() != exec.user {
            return Err(NodeError::SessionUser(format!(
                "session `{name}` runs as {}; start another session for the other user",
                match session.user() {
                    RunAs::User => "the user",
                    RunAs::Root => "root",
                }
            )));
        }
        Ok(session)
    }

    /// Runs `exec`'s command in `session` (named `name`), its output also to `sink` as it
    /// comes; `exit` or a timeout ends the session.
    pub async fn run_in(
        &self,
        name: &str,
        session: &ShellSession,
        exec: &Exec,
        output_limit: usize,
        sink: Option<crate::session::Sink<'_>>,
    ) -> Result<ExecResult, NodeError> {
        let ran = match session.run(exec, output_limit, sink).await {
            Ok(ran) => ran,
            Err(error) => {
                self.end_session(name).await;
                return Err(NodeError::Internal(error.context("the session's shell")));
            }
        };
        match ran {
            Ran::Finished(result) => Ok(result),
            Ran::Ended(result) => {
                self.end_session(name).await;
                Ok(result)
            }
            Ran::TimedOut { result, pid } => {
                let _ = self
                    .agent
                    .simple(&Request::Signal {
                        pid,
                        signal: crate::session::KILL,
                    })
                    .await;
                self.end_session(name).await;
                Ok(result)
            }
        }
    }

    /// Session `name`, started now (with `exec`'s user, environment and directory) when it
    /// does not exist or has ended.
    async fn session(&self, name: &str, exec: &Exec) -> Result<Arc<ShellSession>, NodeError> {
        let mut sessions = self.sessions.lock().await;
        if let Some(session) = sessions.get(name)
            && session.running().await
        {
            return Ok(Arc::clone(session));
        }
        sessions.remove(name);
        if sessions.len() >= crate::session::MAX_SESSIONS {
            return Err(NodeError::TooManySessions(crate::session::MAX_SESSIONS));
        }
        let mut start = exec.clone();
        // bash when the template has it, else its POSIX shell.
        start.argv = vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            "command -v bash >/dev/null && exec bash --noprofile --norc; exec /bin/sh".to_owned(),
        ];
        start.timeout_ms = None;
        start.stdin = None;
        let request = self.exec_request(&start)?;
        let (pid, events, stdin) = self.start_kept(request, None).await?;
        let stdin = stdin.ok_or_else(|| NodeError::Internal(anyhow::anyhow!("no stdin")))?;
        // One of the sandbox's background processes: listed, counted, signalled like them.
        let process = Arc::new(Background::new(
            pid,
            vec!["shell".to_owned(), format!("(session {name})")],
            None,
            0,
            self.output_budget.clone(),
        ));
        self.lock_processes().insert(pid, Arc::clone(&process));
        let session = Arc::new(ShellSession::new(exec.user, stdin, events, process));
        sessions.insert(name.to_owned(), Arc::clone(&session));
        Ok(session)
    }

    async fn end_session(&self, name: &str) {
        let removed = self.sessions.lock().await.remove(name);
        if let Some(session) = removed {
            session.end().await;
        }
    }
}

impl Hosted {
    /// Claims `id` for a named command `argv` (in `session`); see [`crate::tracked::claim`].
    pub fn claim_exec(
        &self,
        id: &str,
        argv: &[String],
        session: Option<&str>,
    ) -> Result<crate::tracked::Claim, NodeError> {
        crate::tracked::claim(
            &mut self.lock_tracked(),
            id,
            argv,
            session,
            &self.output_budget,
        )
    }

    /// The named command kept under `id`.
    pub fn tracked(&self, id: &str) -> Result<Arc<crate::tracked::Tracked>, NodeError> {
        self.lock_tracked()
            .get(id)
            .cloned()
            .ok_or(NodeError::ExecNotFound)
    }

    /// Forgets the command kept under `id` (it never ran).
    pub fn forget_exec(&self, id: &str) {
        self.lock_tracked().remove(id);
    }

    fn lock_tracked(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Arc<crate::tracked::Tracked>>> {
        self.tracked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
