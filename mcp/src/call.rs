//! What every tool does with the API: a call through the backend for a caller, its refusal
//! as a tool error, its JSON as a result, and a command run with progress for the caller
//! who asked for it (its output then read as it comes, capped as it is collected).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::StreamExt;
use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ProgressNotificationParam};
use rmcp::service::RequestContext;
use sandbase_api::sandboxes::{ExecEvent, ExecRequest, ExecResult};
use serde_json::Value;

use crate::backend::{ApiAnswer, ApiRequest, Backend};
use crate::output::{self, Captured, Command};

/// A tool's outcome: its result, or the tool error that ended it early (`?` on any step).
pub type Outcome = Result<CallToolResult, CallToolResult>;

/// Told how long a command has run, once a second; answers whether to keep telling.
pub type Progress = Box<dyn Fn(u32) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// Who calls a tool, as its calls of the API need it.
pub struct Caller<'a> {
    /// The MCP request's HTTP head (its `Authorization` is the caller's key); `None` over
    /// stdio, where the backend holds the key.
    pub parts: Option<&'a http::request::Parts>,
    /// Where a long command's progress goes, when the caller asked for progress.
    pub progress: Option<Progress>,
}

/// The caller of an MCP request: its HTTP head, and its progress token as a notifier when it
/// asked for progress.
pub(crate) fn caller(context: &RequestContext<RoleServer>) -> Caller<'_> {
    let progress = context.meta.get_progress_token().map(|token| {
        let peer = context.peer.clone();
        Box::new(move |seconds: u32| {
            let (peer, token) = (peer.clone(), token.clone());
            Box::pin(async move {
                let progress = ProgressNotificationParam::new(token, seconds.into())
                    .with_message(format!("running for {seconds} s"));
                peer.notify_progress(progress).await.is_ok()
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>
        }) as crate::call::Progress
    });
    Caller {
        parts: context.extensions.get::<http::request::Parts>(),
        progress,
    }
}

/// A call of the API: its answer whatever the status, or a tool error when the backend
/// could not carry it.
pub async fn api<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    request: ApiRequest,
) -> Result<ApiAnswer, CallToolResult> {
    backend
        .call(caller.parts, request)
        .await
        .map_err(|why| output::tool_error(502, "unavailable", &why))
}

/// An API call that must succeed: its answer, or the refusal as a tool error.
pub async fn api_ok<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    request: ApiRequest,
) -> Result<ApiAnswer, CallToolResult> {
    let answer = api(backend, caller, request).await?;
    if answer.is_success() {
        Ok(answer)
    } else {
        Err(output::refusal(&answer))
    }
}

/// An API call whose JSON answer is the tool's result (with `summary` of it as text).
pub async fn api_json<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    request: ApiRequest,
    summary: impl FnOnce(&Value) -> String,
) -> Outcome {
    let value = api_ok(backend, caller, request)
        .await?
        .json()
        .unwrap_or(Value::Null);
    Ok(output::success(summary(&value), value))
}

/// Runs a command in the sandbox at `path` (`/v1/sandboxes/ID`). A caller who asked for
/// progress hears once a second how long it has run, and its output is read as it comes.
pub async fn run<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    path: &str,
    request: ExecRequest,
) -> Result<Command, CallToolResult> {
    let Some(progress) = &caller.progress else {
        let body = serde_json::to_value(&request).unwrap_or(Value::Null);
        let answer = api_ok(
            backend,
            caller,
            ApiRequest::post(format!("{path}/exec"), body),
        )
        .await?;
        let result: ExecResult = serde_json::from_slice(&answer.body)
            .map_err(|error| output::tool_error(502, "unavailable", &error.to_string()))?;
        return Ok(Command::whole(&result));
    };
    let body = serde_json::to_value(ExecRequest {
        stream: true,
        ..request
    })
    .unwrap_or(Value::Null);
    let stream = backend
        .stream(caller.parts, ApiRequest::post(format!("{path}/exec"), body))
        .await
        .map_err(|why| output::tool_error(502, "unavailable", &why))?;
    if !stream.is_success() {
        let answer = stream
            .collect()
            .await
            .map_err(|why| output::tool_error(502, "unavailable", &why))?;
        return Err(output::refusal(&answer));
    }
    let mut events = stream.body;
    let mut command = Streamed::default();
    let mut ticks = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let (mut seconds, mut telling) = (0u32, true);
    loop {
        tokio::select! {
            chunk = events.next() => match chunk {
                Some(Ok(bytes)) => command.feed(&bytes)?,
                Some(Err(why)) => return Err(output::tool_error(502, "unavailable", &why)),
                None => break,
            },
            _ = ticks.tick(), if telling => {
                seconds += 1;
                telling = progress(seconds).await;
            }
        }
    }
    command.finish()
}

/// A streamed command's NDJSON events, collected: its output capped as it comes, its end.
#[derive(Default)]
struct Streamed {
    line: Vec<u8>,
    stdout: Captured,
    stderr: Captured,
    exit: Option<ExecEvent>,
}

impl Streamed {
    fn feed(&mut self, bytes: &[u8]) -> Result<(), CallToolResult> {
        for &byte in bytes {
            if byte == b'\n' {
                let line = std::mem::take(&mut self.line);
                self.event(&line)?;
            } else {
                self.line.push(byte);
            }
        }
        Ok(())
    }

    fn event(&mut self, line: &[u8]) -> Result<(), CallToolResult> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let event: ExecEvent = serde_json::from_slice(line)
            .map_err(|error| output::tool_error(502, "unavailable", &error.to_string()))?;
        match event {
            ExecEvent::Started { .. } => {}
            ExecEvent::Stdout { stdout, .. } => self.stdout.push(&stdout),
            ExecEvent::Stderr { stderr, .. } => self.stderr.push(&stderr),
            ExecEvent::Error { error } => {
                return Err(output::tool_error(500, &error.code, &error.message));
            }
            exit @ ExecEvent::Exit { .. } => self.exit = Some(exit),
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Command, CallToolResult> {
        let rest = std::mem::take(&mut self.line);
        self.event(&rest)?;
        match self.exit {
            Some(ExecEvent::Exit {
                exit_code,
                timed_out,
                duration_ms,
                ..
            }) => Ok(Command {
                exit_code: i64::from(exit_code),
                timed_out,
                duration_ms,
                stdout: self.stdout,
                stderr: self.stderr,
                sandbox_id: None,
            }),
            _ => Err(output::tool_error(
                502,
                "unavailable",
                "the command's stream ended before its exit",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command's events, cut at every byte boundary, read as the whole stream would be.
    #[test]
    fn a_streamed_command_reads_the_same_however_its_stream_is_cut() {
        let stream = concat!(
            "{\"pid\":7}\n",
            "{\"stdout\":\"h\\u00e9llo\\n\"}\n",
            "{\"stderr\":\"warn\"}\n",
            "{\"exit_code\":3,\"timed_out\":false,\"duration_ms\":12}\n",
        )
        .as_bytes();
        for cut in 0..stream.len() {
            let mut command = Streamed::default();
            assert!(command.feed(&stream[..cut]).is_ok());
            assert!(command.feed(&stream[cut..]).is_ok());
            let finished = command.finish().ok().map(|done| {
                (
                    done.exit_code,
                    done.stdout.shown(),
                    done.stderr.shown(),
                    done.duration_ms,
                )
            });
            assert_eq!(
                finished,
                Some((3, "h\u{e9}llo\n".to_owned(), "warn".to_owned(), 12)),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_stream_that_ends_without_an_exit_or_with_an_error_is_a_tool_error() {
        let mut cut_short = Streamed::default();
        assert!(cut_short.feed(b"{\"pid\":7}\n{\"stdout\":\"x\"}\n").is_ok());
        assert!(cut_short.finish().is_err());
        let mut failed = Streamed::default();
        let error = b"{\"error\":{\"code\":\"sandbox_not_running\",\"message\":\"gone\"}}\n";
        assert!(failed.feed(error).is_err());
    }
}
