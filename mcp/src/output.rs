//! What tools answer: the API's JSON as structured content with a short text, a command's
//! output capped with a clear marker, and API refusals as tool errors carrying SandBase's
//! stable code (`insufficient_credits`, `not_found`, …) — so the model sees why and the
//! client does not mistake a refusal for a protocol failure.

use rmcp::model::{CallToolResult, ContentBlock as Content};
use serde_json::{Value, json};

use crate::backend::ApiAnswer;

/// The most of each output stream a tool hands back (the model's context is precious).
pub const OUTPUT_CAP: usize = 32 * 1024;

/// A text capped at [`OUTPUT_CAP`] bytes (on a character boundary), with a marker saying
/// how much was left out.
pub fn capped(text: &str) -> String {
    if text.len() <= OUTPUT_CAP {
        return text.to_owned();
    }
    let mut end = OUTPUT_CAP;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[… output truncated: {} of {} bytes not shown]",
        &text[..end],
        text.len() - end,
        text.len()
    )
}

/// An API refusal (or a transport failure) as a tool error: `{"error": {code, message}}`.
pub fn refusal(answer: &ApiAnswer) -> CallToolResult {
    let body = answer.json().unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str().unwrap_or("error").to_owned();
    let message = body["error"]["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(&answer.body).into_owned());
    tool_error(answer.status, &code, &message)
}

pub fn tool_error(status: u16, code: &str, message: &str) -> CallToolResult {
    let error = json!({ "error": { "status": status, "code": code, "message": message } });
    let mut result = CallToolResult::error(vec![Content::text(format!("{code}: {message}"))]);
    result.structured_content = Some(error);
    result
}

/// A successful answer: `summary` as text, `value` as structured content.
pub fn success(summary: String, value: Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![Content::text(summary)]);
    result.structured_content = Some(value);
    result
}

/// One output stream of a command as a tool shows it: its first [`OUTPUT_CAP`] bytes and
/// how long it was, collected whole or as it comes.
#[derive(Debug, Default)]
pub struct Captured {
    kept: String,
    total: usize,
}

impl Captured {
    pub fn whole(text: &str) -> Captured {
        let mut captured = Captured::default();
        captured.push(text);
        captured
    }

    /// Takes the next piece: kept while under the cap, counted either way.
    pub fn push(&mut self, text: &str) {
        self.total += text.len();
        let room = OUTPUT_CAP.saturating_sub(self.kept.len());
        let mut end = room.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.kept.push_str(&text[..end]);
    }

    /// The text shown: all of it, or the kept part and a marker saying how much was left
    /// out.
    pub fn shown(&self) -> String {
        if self.total <= self.kept.len() {
            return self.kept.clone();
        }
        format!(
            "{}\n[… output truncated: {} of {} bytes not shown]",
            self.kept,
            self.total - self.kept.len(),
            self.total
        )
    }
}

/// A finished command as a tool reports it.
#[derive(Debug)]
pub struct Command {
    pub exit_code: i64,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout: Captured,
    pub stderr: Captured,
    /// The sandbox it ran in, when the tool made that sandbox for it.
    pub sandbox_id: Option<String>,
}

impl Command {
    /// A command answered whole by the API.
    pub fn whole(result: &sandbase_api::sandboxes::ExecResult) -> Command {
        Command {
            exit_code: i64::from(result.exit_code),
            timed_out: result.timed_out,
            duration_ms: result.duration_ms,
            stdout: Captured::whole(&result.stdout),
            stderr: Captured::whole(&result.stderr),
            sandbox_id: None,
        }
    }
}

/// A finished command: exit code, capped output, and the same as structured content.
pub fn command(command: &Command) -> CallToolResult {
    let stdout = command.stdout.shown();
    let stderr = command.stderr.shown();
    let mut text = format!("exit code {}", command.exit_code);
    if command.timed_out {
        text.push_str(" (timed out)");
    }
    if !stdout.is_empty() {
        text.push_str("\n--- stdout ---\n");
        text.push_str(&stdout);
    }
    if !stderr.is_empty() {
        text.push_str("\n--- stderr ---\n");
        text.push_str(&stderr);
    }
    let mut structured = json!({
        "exit_code": command.exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "timed_out": command.timed_out,
        "duration_ms": command.duration_ms,
    });
    if let Some(sandbox) = &command.sandbox_id {
        structured["sandbox_id"] = json!(sandbox);
        text = format!("sandbox {sandbox}\n{text}");
    }
    let mut answer = CallToolResult::success(vec![Content::text(text)]);
    answer.structured_content = Some(structured);
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_collected_in_pieces_is_capped_like_output_collected_whole() {
        let long = "abé".repeat(OUTPUT_CAP);
        let mut pieces = Captured::default();
        for piece in long.split_inclusive('é') {
            pieces.push(piece);
        }
        assert_eq!(Captured::whole(&long).shown(), capped(&long));
        assert_eq!(pieces.shown(), capped(&long));
        assert_eq!(Captured::whole("short").shown(), "short");
    }

    #[test]
    fn long_output_is_capped_with_a_marker_on_a_character_boundary() {
        let short = "hello";
        assert_eq!(capped(short), short);
        let long = "é".repeat(OUTPUT_CAP);
        let out = capped(&long);
        assert!(out.contains("output truncated"));
        assert!(out.len() < long.len());
        assert!(out.starts_with('é'));
    }
}
