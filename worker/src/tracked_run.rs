//! Running a named command in a task of its own (so it outlives its caller) and cancelling
//! it: a plain command through the agent, a session's command through its shell.

use std::sync::Arc;
use std::time::Instant;

use sandbase_agent::protocol::{ExitInfo, Request};
use sandbase_api::internal::Exec;

use crate::agent_client::{self, ExecEvent, Refused};
use crate::background::Stream;
use crate::command_recording::CommandCast;
use crate::exec::Hosted;
use crate::pause::Active;
use crate::recording::RecordingSink;
use crate::session::ShellSession;
use crate::tracked::{CANCEL_GRACE, Target, Tracked};

/// A command's recording and where it goes when the command ends.
pub type Recording = Option<(CommandCast, Arc<RecordingSink>)>;

/// Runs `exec` (a plain command) to its end into `tracked`; the sandbox counts as busy
/// meanwhile.
pub async fn run_command(active: Active, tracked: Arc<Tracked>, exec: Exec, recording: Recording) {
    let started = Instant::now();
    let mut recording = recording;
    let request = match active.exec_request(&exec) {
        Ok(request) => request,
        Err(error) => return tracked.fail(-1, &error.to_string(), started),
    };
    let stdin = exec.stdin.map(String::into_bytes);
    let mut events = match active.agent.exec(request, stdin).await {
        Ok(events) => events,
        Err(error) => return tracked.fail(-1, &format!("{error:#}"), started),
    };
    while let Some(event) = events.recv().await {
        match event {
            Ok(ExecEvent::Started { pid }) => tracked.started(pid, Target::Group(pid)),
            Ok(ExecEvent::Stdout(bytes)) => {
                if let Some((cast, _)) = &mut recording {
                    cast.stdout(&bytes);
                }
                tracked.append(Stream::Stdout, &bytes);
            }
            Ok(ExecEvent::Stderr(bytes)) => {
                if let Some((cast, _)) = &mut recording {
                    cast.stderr(&bytes);
                }
                tracked.append(Stream::Stderr, &bytes);
            }
            Ok(ExecEvent::Exit(exit)) => {
                if let Some((cast, sink)) = recording.take() {
                    cast.send(sink, Some(exit.code));
                }
                return tracked.finish(exit);
            }
            Err(failure) => return not_started_or_broken(&tracked, failure, started),
        }
    }
    tracked.fail(-1, "the command's output stream broke", started);
}

/// A command the agent could not start ends like a shell's (127 not found, 126 not
/// runnable, the reason on stderr); a stream that broke later ends with -1.
fn not_started_or_broken(tracked: &Tracked, failure: anyhow::Error, started: Instant) {
    match failure.downcast::<Refused>() {
        Ok(Refused(refusal)) => {
            let code = if refusal.kind == "not_found" {
                127
            } else {
                126
            };
            tracked.fail(code, &refusal.message, started);
        }
        Err(other) => {
            tracing::warn!(
                error = format!("{other:#}"),
                "a named command's stream broke"
            );
            tracked.fail(-1, "the command's output stream broke", started);
        }
    }
}

/// Runs `exec` in `session` (named `name`) to its end into `tracked`, its output streamed
/// as it comes.
pub async fn run_in_session(
    active: Active,
    tracked: Arc<Tracked>,
    name: String,
    session: Arc<ShellSession>,
    exec: Exec,
    recording: Recording,
) {
    let started = Instant::now();
    tracked.started(session.pid(), Target::Descendants(session.pid()));
    let into = Arc::clone(&tracked);
    let mut sink = move |stream: Stream, bytes: &[u8]| into.append(stream, bytes);
    let limit = crate::tracked::RING_BYTES;
    match active
        .run_in(&name, &session, &exec, limit, Some(&mut sink))
        .await
    {
        Ok(result) => {
            if let Some((mut cast, sink)) = recording {
                cast.stdout(result.stdout.as_bytes());
                cast.stderr(result.stderr.as_bytes());
                cast.send(sink, Some(result.exit_code));
            }
            tracked.finish(ExitInfo {
                code: result.exit_code,
                signal: result.signal,
                timed_out: result.timed_out,
                duration_ms: result.duration_ms,
            });
        }
        Err(error) => tracked.fail(-1, &error.to_string(), started),
    }
}

impl Hosted {
    /// Interrupts a named command: SIGINT now, SIGKILL after [`CANCEL_GRACE`] when it still
    /// runs. A session's shell survives (only the processes below it are signalled), so its
    /// working directory and environment carry on.
    pub async fn cancel(self: &Arc<Self>, tracked: &Arc<Tracked>) -> anyhow::Result<()> {
        let Some(target) = tracked.cancel() else {
            return Ok(());
        };
        self.signal_target(target, 2).await?;
        let hosted = Arc::clone(self);
        let tracked = Arc::clone(tracked);
        tokio::spawn(async move {
            tokio::time::sleep(CANCEL_GRACE).await;
            if tracked.running()
                && let Err(error) = hosted.signal_target(target, 9).await
            {
                tracing::debug!(error = format!("{error:#}"), "killing a cancelled command");
            }
        });
        Ok(())
    }

    async fn signal_target(&self, target: Target, signal: i32) -> anyhow::Result<()> {
        let request = match target {
            Target::Group(pid) => Request::Signal { pid, signal },
            Target::Descendants(pid) => Request::SignalDescendants { pid, signal },
        };
        match self.agent.simple(&request).await {
            Ok(_) => Ok(()),
            // It ended in between: nothing to signal.
            Err(error) if error.downcast_ref::<agent_client::Refused>().is_some() => Ok(()),
            Err(error) => Err(error),
        }
    }
}
