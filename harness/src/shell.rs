//! The `shell` tool: one bash session per run, each command under its step's exec id (a
//! second start of the same id answers the first and runs nothing), streamed: its output read as the sandbox prints it (the exec
//! endpoint's NDJSON events), each piece passed on as it comes — at most [`STREAMED_MOST`]
//! bytes of it, so a command printing megabytes does not fill the journal — and the whole
//! result, as the same command answers unstreamed (the last MiB of each stream kept), for the
//! model.

use futures_util::StreamExt;
use sandbase_mcp::{ApiBody, ApiRequest, Backend, Caller};
use serde_json::{Value, json};

use crate::delta::{Delta, DeltaKind};
use crate::output::{self, ToolOutcome, refusal};

/// The shell session every `shell` call of a run runs in.
pub const SHELL_SESSION: &str = "agent";

/// Seconds a `shell` or `python` call may run unless the model asks otherwise.
pub const DEFAULT_TOOL_SECS: u64 = 600;

/// Where the pieces of a command's output go as they come: part 0 is its standard output,
/// part 1 its standard error.
pub type OutputSink = tokio::sync::mpsc::UnboundedSender<Delta>;

/// Bytes of a command's output passed on as pieces at most; the rest is in its result.
pub const STREAMED_MOST: usize = 64 * 1024;

/// Bytes of each stream kept for the result (the exec endpoint keeps as much).
const KEPT: usize = 1 << 20;

/// Where a sandbox's named command's whole output is kept.
pub fn kept_at(sandbox: &str, exec_id: &str) -> String {
    format!("GET /v1/sandboxes/{sandbox}/execs/{exec_id}")
}

pub(crate) fn timeout(arguments: &Value) -> u64 {
    arguments["timeout_secs"]
        .as_u64()
        .unwrap_or(DEFAULT_TOOL_SECS)
        .clamp(1, 3600)
}

/// The exec request of a `shell` call (the same for its first start and any later one).
pub fn shell_request(sandbox: &str, exec_id: &str, arguments: &Value) -> Option<ApiRequest> {
    let command = arguments["command"].as_str()?;
    Some(ApiRequest::post(
        format!("/v1/sandboxes/{sandbox}/exec"),
        json!({ "command": command, "session": SHELL_SESSION, "exec_id": exec_id,
                "timeout_secs": timeout(arguments) }),
    ))
}

/// A named command's result (`ExecResult`) as the model sees it.
pub fn command_outcome(sandbox: &str, exec_id: &str, result: &Value) -> ToolOutcome {
    let exit = result["exit_code"].as_i64().unwrap_or(-1);
    let mut text = String::new();
    let stdout = result["stdout"].as_str().unwrap_or_default();
    let stderr = result["stderr"].as_str().unwrap_or_default();
    text.push_str(stdout);
    if !stderr.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(stderr);
    }
    let head = format!("exit code {exit}\n");
    let mut notes = String::new();
    if result["timed_out"] == true {
        notes.push_str("[the command timed out and was killed]\n");
    }
    if result["truncated"] == true {
        notes.push_str("[only the last MiB of the output was kept]\n");
    }
    let room = output::MAX_SHOWN - head.len() - notes.len();
    let shown = output::shown_within(&text, &kept_at(sandbox, exec_id), room);
    ToolOutcome {
        content: format!("{head}{notes}{shown}"),
        is_error: exit != 0,
        detail: json!({ "exit_code": exit, "exec_id": exec_id,
                        "duration_ms": result["duration_ms"], "timed_out": result["timed_out"],
                        "output_bytes": text.len() }),
    }
}

/// Runs a `shell` call, its output passed to `sink` as it comes when there is one.
pub async fn run<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    sandbox: &str,
    exec_id: &str,
    arguments: &Value,
    sink: Option<&OutputSink>,
) -> ToolOutcome {
    let Some(request) = shell_request(sandbox, exec_id, arguments) else {
        return ToolOutcome::error("`command` (a string) is required");
    };
    let Some(sink) = sink else {
        return whole(backend.call(caller.parts, request).await, sandbox, exec_id);
    };
    let mut streamed = request.clone();
    if let Some(ApiBody::Json(body)) = &mut streamed.body {
        body["stream"] = json!(true);
    }
    let answer = match backend.stream(caller.parts, streamed).await {
        Ok(answer) => answer,
        Err(why) => return ToolOutcome::error(format!("the sandbox could not be reached: {why}")),
    };
    if !answer.is_success() || answer.content_type.as_deref() != Some("application/x-ndjson") {
        return whole(answer.collect().await, sandbox, exec_id);
    }
    let mut output = Output::default();
    let mut body = answer.body;
    let mut line = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        for byte in chunk {
            if byte != b'\n' {
                line.push(byte);
                continue;
            }
            let event: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
            line.clear();
            match output.event(&event, sink) {
                Some(Ok(result)) => return command_outcome(sandbox, exec_id, &result),
                Some(Err(why)) => return ToolOutcome::error(why),
                None => {}
            }
        }
    }
    // The stream broke off before the command's end; the command goes on under its exec id,
    // and starting it again answers its result.
    whole(backend.call(caller.parts, request).await, sandbox, exec_id)
}

/// A command's result that came whole (or a refusal).
fn whole(
    answer: Result<sandbase_mcp::ApiAnswer, String>,
    sandbox: &str,
    exec_id: &str,
) -> ToolOutcome {
    let answer = match answer {
        Ok(answer) => answer,
        Err(why) => return ToolOutcome::error(format!("the sandbox could not be reached: {why}")),
    };
    let body = answer.json().unwrap_or(Value::Null);
    if !answer.is_success() {
        return ToolOutcome::error(refusal(&body, answer.status));
    }
    command_outcome(sandbox, exec_id, &body)
}

/// A command's output as its events came.
#[derive(Debug, Default)]
struct Output {
    stdout: String,
    stderr: String,
    truncated: bool,
    streamed: usize,
}

impl Output {
    /// Takes in one event: the result (an `ExecResult`'s fields) once the command exited, an
    /// error when the endpoint sent one.
    fn event(&mut self, event: &Value, sink: &OutputSink) -> Option<Result<Value, String>> {
        if let Some(text) = event["stdout"].as_str() {
            self.piece(0, text, sink);
        } else if let Some(text) = event["stderr"].as_str() {
            self.piece(1, text, sink);
        } else if event.get("exit_code").is_some() {
            return Some(Ok(json!({
                "exit_code": event["exit_code"], "signal": event["signal"],
                "timed_out": event["timed_out"], "duration_ms": event["duration_ms"],
                "stdout": self.stdout, "stderr": self.stderr, "truncated": self.truncated })));
        } else if let Some(error) = event.get("error") {
            let message = error["message"].as_str().unwrap_or("the command failed");
            return Some(Err(format!("the command failed: {message}")));
        }
        None
    }

    fn piece(&mut self, part: usize, text: &str, sink: &OutputSink) {
        let room = STREAMED_MOST.saturating_sub(self.streamed);
        if room > 0 {
            let mut cut = text.len().min(room);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            self.streamed += cut;
            let delta = Delta {
                part,
                kind: DeltaKind::Text,
                text: text[..cut].to_owned(),
                call: None,
            };
            let _ = sink.send(delta);
        }
        let kept = if part == 0 {
            &mut self.stdout
        } else {
            &mut self.stderr
        };
        kept.push_str(text);
        // The last MiB is kept: the front is dropped once it doubled (not at every piece).
        if kept.len() > 2 * KEPT {
            let mut cut = kept.len() - KEPT;
            while !kept.is_char_boundary(cut) {
                cut += 1;
            }
            kept.drain(..cut);
            self.truncated = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_go_on_up_to_the_cap_and_the_result_keeps_the_last_mib() {
        let (sink, mut pieces) = tokio::sync::mpsc::unbounded_channel();
        let mut output = Output::default();
        let line = "é".repeat(512);
        for _ in 0..3000 {
            assert!(output.event(&json!({ "stdout": line }), &sink).is_none());
        }
        output.event(&json!({ "stderr": "oops" }), &sink);
        let result = output
            .event(
                &json!({ "exit_code": 1, "timed_out": false, "duration_ms": 5 }),
                &sink,
            )
            .expect("exited")
            .expect("a result");
        let mut streamed = 0;
        while let Ok(piece) = pieces.try_recv() {
            assert_eq!(piece.part, 0);
            streamed += piece.text.len();
        }
        assert_eq!(streamed, STREAMED_MOST);
        assert!(result["stdout"].as_str().unwrap().len() <= 2 * KEPT);
        assert_eq!(
            (result["stderr"].as_str(), result["truncated"].as_bool()),
            (Some("oops"), Some(true))
        );
        let failed = output.event(&json!({ "error": { "message": "gone" } }), &sink);
        assert_eq!(failed, Some(Err("the command failed: gone".into())));
    }
}
