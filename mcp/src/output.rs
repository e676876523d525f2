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

/// A finished command: exit code, capped output, and the same as structured content.
pub fn command(result: &Value) -> CallToolResult {
    let stdout = capped(result["stdout"].as_str().unwrap_or_default());
    let stderr = capped(result["stderr"].as_str().unwrap_or_default());
    let exit_code = result["exit_code"].as_i64().unwrap_or(-1);
    let timed_out = result["timed_out"].as_bool().unwrap_or(false);
    let mut text = format!("exit code {exit_code}");
    if timed_out {
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
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "timed_out": timed_out,
        "duration_ms": result["duration_ms"],
    });
    if let Some(sandbox) = result.get("sandbox_id") {
        structured["sandbox_id"] = sandbox.clone();
        text = format!("sandbox {}\n{text}", sandbox.as_str().unwrap_or_default());
    }
    let mut answer = CallToolResult::success(vec![Content::text(text)]);
    answer.structured_content = Some(structured);
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

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
