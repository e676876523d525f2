//! The terminal sessions of a hosted sandbox: opened with the sandbox's environment,
//! directory and user, at most [`MAX_TERMINALS`] at once, closed by a hang-up (then a kill),
//! and ended when idle.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sandbase_agent::protocol::{PtyRequest, Request};
use sandbase_api::internal::Exec;
use sandbase_api::terminals::OpenTerminalRequest;

use crate::error::NodeError;
use crate::exec::Hosted;
use crate::recording::RecordingSink;
use crate::terminal::{MAX_TERMINALS, Opened, Terminal};

/// How long a hung-up session may take to end before it is killed.
const HANGUP_GRACE: Duration = Duration::from_secs(2);

impl Hosted {
    /// Opens a terminal session.
    pub async fn open_terminal(
        self: &Arc<Self>,
        request: &OpenTerminalRequest,
        recordings: Option<Arc<RecordingSink>>,
    ) -> Result<Arc<Terminal>, NodeError> {
        if request.cols == 0 || request.rows == 0 || request.cols > 1000 || request.rows > 1000 {
            return Err(NodeError::Invalid(
                "`cols` and `rows`: from 1 to 1000".to_owned(),
            ));
        }
        let live = self.terminals().iter().filter(|t| !t.ended()).count();
        if live >= MAX_TERMINALS {
            return Err(NodeError::TooManyTerminals(MAX_TERMINALS));
        }
        let argv = request.cmd.clone().unwrap_or_default();
        // The sandbox's environment, directory and user, as for a command.
        let base = self.exec_request(&Exec {
            env: request.env.clone(),
            cwd: request.cwd.clone(),
            ..Exec::new(vec!["sh".to_owned()], request.user)
        })?;
        let (session, pid) = self
            .agent
            .pty_open(PtyRequest {
                argv: argv.clone(),
                env: base.env,
                cwd: base.cwd,
                user: base.user,
                cols: request.cols,
                rows: request.rows,
            })
            .await?;
        let opened = Opened {
            session,
            pid,
            command: argv,
            cols: request.cols,
            rows: request.rows,
            idle_timeout: request.idle_timeout_secs.map(Duration::from_secs),
            recording: request
                .recording
                .zip(recordings)
                .map(|(id, sink)| (id, request.record_input.unwrap_or(true), sink)),
        };
        let terminal = match Terminal::start(&self.agent, opened).await {
            Ok(terminal) => terminal,
            Err(error) => {
                let _ = self
                    .agent
                    .simple(&Request::PtySignal { session, signal: 9 })
                    .await;
                return Err(error);
            }
        };
        self.lock_terminals().insert(session, Arc::clone(&terminal));
        tokio::spawn(end_when_idle(Arc::downgrade(self), Arc::clone(&terminal)));
        Ok(terminal)
    }

    pub fn terminal(&self, session: u32) -> Result<Arc<Terminal>, NodeError> {
        self.lock_terminals()
            .get(&session)
            .cloned()
            .ok_or(NodeError::TerminalNotFound)
    }

    /// Its terminal sessions.
    pub fn terminals(&self) -> Vec<Arc<Terminal>> {
        self.lock_terminals().values().cloned().collect()
    }

    fn lock_terminals(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Terminal>>> {
        self.terminals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends a session: `HUP` to its process group, `KILL` if it is still there after a
    /// grace period; then it is forgotten.
    pub async fn close_terminal(&self, session: u32) -> Result<(), NodeError> {
        let terminal = self.terminal(session)?;
        for signal in [1, 9] {
            if terminal.ended() {
                break;
            }
            self.agent
                .simple(&Request::PtySignal { session, signal })
                .await?;
            if terminal.wait_ended(HANGUP_GRACE).await {
                break;
            }
        }
        self.lock_terminals().remove(&session);
        Ok(())
    }
}

/// Ends `terminal` once nobody was attached and nothing was typed for its idle timeout
/// (or forgets it once its sandbox is gone).
async fn end_when_idle(hosted: std::sync::Weak<Hosted>, terminal: Arc<Terminal>) {
    loop {
        tokio::time::sleep(terminal.idle_check()).await;
        if terminal.ended() {
            return;
        }
        if terminal.idle() {
            let Some(hosted) = hosted.upgrade() else {
                return;
            };
            tracing::info!(
                session = terminal.session,
                "ending an idle terminal session"
            );
            let _ = hosted.close_terminal(terminal.session).await;
            return;
        }
    }
}
