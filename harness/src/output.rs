//! What a model is shown of a tool's output: at most [`MAX_SHOWN`] bytes — its first and
//! last half of that — and a line saying how much was left out and where the whole of it is
//! kept; a tool call's outcome ([`ToolOutcome`]).

use serde_json::{Value, json};

/// The most of one tool output a model is shown.
pub const MAX_SHOWN: usize = 16 * 1024;

/// `text` as a model is shown it: whole when it fits, else its first and last
/// `MAX_SHOWN / 2` bytes (cut at character boundaries) around a line naming what was left
/// out and `kept_at`, where the whole output can be read.
pub fn shown(text: &str, kept_at: &str) -> String {
    shown_within(text, kept_at, MAX_SHOWN)
}

/// The same within `max` bytes (what is left of [`MAX_SHOWN`] beside other lines).
pub fn shown_within(text: &str, kept_at: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let half = max / 2;
    let mut head_end = half;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - half;
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let elided = tail_start - head_end;
    // The note itself takes room: the head and tail give it back, so the whole stays within.
    let note = format!("\n[… {elided} bytes elided; the whole output: {kept_at} …]\n");
    let room = note.len().div_ceil(2);
    let mut head_cut = head_end.saturating_sub(room);
    while !text.is_char_boundary(head_cut) {
        head_cut -= 1;
    }
    let mut tail_cut = (tail_start + room).min(text.len());
    while !text.is_char_boundary(tail_cut) {
        tail_cut += 1;
    }
    let elided = tail_cut - head_cut;
    let note = format!("\n[… {elided} bytes elided; the whole output: {kept_at} …]\n");
    format!("{}{note}{}", &text[..head_cut], &text[tail_cut..])
}

/// What a tool call gave.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// What the model is shown (capped).
    pub content: String,
    pub is_error: bool,
    /// For the ledger: exit code, duration, the exec id the output is kept under…
    pub detail: Value,
}

impl ToolOutcome {
    pub fn error(message: impl Into<String>) -> ToolOutcome {
        let content = message.into();
        ToolOutcome {
            detail: json!({ "error": content }),
            content,
            is_error: true,
        }
    }

    /// A call whose end is unknown (its gateway stopped while it ran).
    pub fn interrupted(message: impl Into<String>) -> ToolOutcome {
        let mut outcome = ToolOutcome::error(message);
        outcome.detail["interrupted"] = json!(true);
        outcome
    }

    /// The ledger's state of the step it ends.
    pub fn step_state(&self) -> &'static str {
        if self.detail["interrupted"] == true {
            "interrupted"
        } else if self.is_error {
            "failed"
        } else {
            "completed"
        }
    }
}

/// An API refusal as the model is told it.
pub fn refusal(body: &Value, status: u16) -> String {
    let code = body["error"]["code"].as_str().unwrap_or("error");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    format!("refused ({status} {code}): {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_output_is_shown_whole() {
        assert_eq!(shown("hello\n", "x"), "hello\n");
    }

    #[test]
    fn a_long_output_keeps_its_ends_within_the_cap() {
        let text = format!("BEGIN{}END", "é".repeat(5_000_000));
        let seen = shown(&text, "GET /v1/sandboxes/s/execs/e");
        assert!(seen.len() <= MAX_SHOWN, "{}", seen.len());
        assert!(seen.starts_with("BEGIN") && seen.ends_with("END"));
        assert!(seen.contains("bytes elided; the whole output: GET /v1/sandboxes/s/execs/e"));
    }
}
