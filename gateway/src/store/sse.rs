//! The observe-only tap on a streamed (server-sent events) answer: every upstream chunk is
//! forwarded as it arrives, byte for byte, while the tap reads the usage out of the events.
//! One exception: when the gateway itself asked an OpenAI chat stream for its usage (the
//! client did not), the usage-only chunk that request added is held back from the client —
//! then events are forwarded whole, each as soon as its blank line arrived.

use bytes::Bytes;
use serde_json::Value;

use super::usage::{self, Shape, TokenUsage};

/// An event larger than this is forwarded without being read.
const MAX_EVENT: usize = 1024 * 1024;

pub struct Tap {
    shape: Shape,
    /// Hold back the usage-only chunk the gateway asked for.
    hide_usage: bool,
    pending: Vec<u8>,
    usage: Option<TokenUsage>,
    /// Whether the stream's final usage report arrived (Anthropic's `message_delta`, the
    /// usage chunk of a chat stream, a Responses terminal event with its usage).
    complete: bool,
    /// Output the deltas carried: events, and characters of their text and arguments.
    delta_events: u64,
    delta_chars: u64,
}

/// A stream's usage as the tap saw it.
pub struct Report {
    /// `None`: not even the input count came (the reservation is billed).
    pub usage: Option<TokenUsage>,
    /// The provider's own final count; otherwise the output is at least what the deltas
    /// carried (a token per delta, or per four characters, whichever is more, rounded up).
    pub complete: bool,
}

impl Tap {
    pub fn new(shape: Shape, hide_usage: bool) -> Tap {
        Tap {
            shape,
            hide_usage,
            pending: Vec::new(),
            usage: None,
            complete: false,
            delta_events: 0,
            delta_chars: 0,
        }
    }

    /// The usage to bill: the provider's final count when it came; for a stream cut before
    /// it, the input it reported and at least the output its deltas carried.
    pub fn report(&self) -> Report {
        if self.complete {
            return Report {
                usage: self.usage,
                complete: true,
            };
        }
        let carried = self.delta_events.max(self.delta_chars.div_ceil(4));
        Report {
            usage: self.usage.map(|mut usage| {
                usage.output_tokens = usage.output_tokens.max(carried);
                usage
            }),
            complete: false,
        }
    }

    /// Takes an upstream chunk; returns what to send the client now.
    pub fn feed(&mut self, chunk: &Bytes) -> Bytes {
        self.pending.extend_from_slice(chunk);
        let mut forward = Vec::new();
        while let Some(end) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end).collect();
            let keep = self.observe(&event);
            if self.hide_usage && keep {
                forward.extend_from_slice(&event);
            }
        }
        if self.pending.len() > MAX_EVENT {
            // Not an event stream the tap can read: pass it on unread.
            let unread = std::mem::take(&mut self.pending);
            if self.hide_usage {
                forward.extend_from_slice(&unread);
            }
        }
        if self.hide_usage {
            Bytes::from(forward)
        } else {
            chunk.clone()
        }
    }

    /// The end of the stream: what is still held back (an unterminated last event).
    pub fn finish(&mut self) -> Bytes {
        let rest = std::mem::take(&mut self.pending);
        if self.hide_usage {
            Bytes::from(rest)
        } else {
            Bytes::new()
        }
    }

    /// Reads one whole event; `false` when it is the usage-only chunk to hold back.
    fn observe(&mut self, event: &[u8]) -> bool {
        let Some(data) = data_of(event) else {
            return true;
        };
        // Most events carry text, not usage: only those that can hold a count are parsed,
        // and the deltas, whose output is counted in case the final count never comes.
        let may_count = match self.shape {
            Shape::OpenaiChat | Shape::OpenaiEmbeddings => data.contains("prompt_tokens"),
            Shape::OpenaiResponses => data.contains("input_tokens"),
            Shape::Anthropic => data.contains("message_start") || data.contains("message_delta"),
        };
        let carries_output = data.contains("delta");
        if !may_count && !carries_output {
            return true;
        }
        let Ok(json) = serde_json::from_str::<Value>(&data) else {
            return true;
        };
        if carries_output {
            self.count_output(&json);
        }
        if !may_count {
            return true;
        }
        match self.shape {
            Shape::OpenaiChat | Shape::OpenaiEmbeddings => {
                let Some(found) = json.get("usage").and_then(usage::openai_chat) else {
                    return true;
                };
                self.usage = Some(found);
                self.complete = true;
                let usage_only = json
                    .get("choices")
                    .and_then(Value::as_array)
                    .is_some_and(Vec::is_empty);
                !(self.hide_usage && usage_only)
            }
            Shape::OpenaiResponses => {
                if let Some(found) = json
                    .pointer("/response/usage")
                    .and_then(usage::openai_responses)
                {
                    self.usage = Some(found);
                    // Only a terminal event's count is final.
                    let kind = json.get("type").and_then(Value::as_str).unwrap_or_default();
                    self.complete = matches!(
                        kind,
                        "response.completed" | "response.incomplete" | "response.failed"
                    );
                }
                true
            }
            Shape::Anthropic => {
                self.observe_anthropic(&json);
                true
            }
        }
    }

    /// Counts the output text, thinking and tool arguments a delta event carries.
    fn count_output(&mut self, json: &Value) {
        let mut chars = 0;
        let mut add = |value: Option<&Value>| {
            if let Some(text) = value.and_then(Value::as_str) {
                chars += text.chars().count() as u64;
            }
        };
        match self.shape {
            Shape::Anthropic => {
                if let Some(delta) = json.get("delta") {
                    for field in ["text", "partial_json", "thinking"] {
                        add(delta.get(field));
                    }
                }
            }
            Shape::OpenaiChat => {
                let choices = json.get("choices").and_then(Value::as_array);
                for delta in choices.into_iter().flatten().filter_map(|c| c.get("delta")) {
                    add(delta.get("content"));
                    add(delta.get("reasoning_content"));
                    let calls = delta.get("tool_calls").and_then(Value::as_array);
                    for call in calls.into_iter().flatten() {
                        add(call.pointer("/function/arguments"));
                    }
                }
            }
            Shape::OpenaiResponses => {
                let kind = json.get("type").and_then(Value::as_str).unwrap_or_default();
                if kind.ends_with(".delta") {
                    add(json.get("delta"));
                }
            }
            Shape::OpenaiEmbeddings => {}
        }
        if chars > 0 {
            self.delta_events += 1;
            self.delta_chars += chars;
        }
    }

    /// `message_start` gives the input and cache counts (and a first output count);
    /// each `message_delta` gives the output so far (cumulative: the last one counts) and
    /// may restate the others.
    fn observe_anthropic(&mut self, json: &Value) {
        match json.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(found) = json.pointer("/message/usage").and_then(usage::anthropic) {
                    self.usage = Some(found);
                }
            }
            Some("message_delta") => {
                let Some(delta) = json.get("usage").filter(|usage| usage.is_object()) else {
                    return;
                };
                let mut usage = self.usage.unwrap_or_default();
                let take = |field: &str, into: &mut u64| {
                    if let Some(value) = delta.get(field).and_then(Value::as_u64) {
                        *into = value;
                    }
                };
                take("output_tokens", &mut usage.output_tokens);
                take("input_tokens", &mut usage.input_tokens);
                take("cache_read_input_tokens", &mut usage.cached_input_tokens);
                take("cache_creation_input_tokens", &mut usage.cache_write_tokens);
                self.usage = Some(usage);
                // The last one, with the stop reason, is the final count.
                self.complete = json
                    .pointer("/delta/stop_reason")
                    .is_some_and(|reason| !reason.is_null());
            }
            _ => {}
        }
    }
}

/// Where the first event in `bytes` ends (after its blank line).
pub(crate) fn event_end(bytes: &[u8]) -> Option<usize> {
    let mut index = 0;
    while index + 1 < bytes.len() {
        if bytes[index] == b'\n' {
            if bytes[index + 1] == b'\n' {
                return Some(index + 2);
            }
            if bytes[index + 1] == b'\r' && bytes.get(index + 2) == Some(&b'\n') {
                return Some(index + 3);
            }
        }
        index += 1;
    }
    None
}

/// The event's data (its `data:` lines joined), unless it is `[DONE]` or has none.
pub(crate) fn data_of(event: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(event).ok()?;
    let mut data: Option<String> = None;
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(value) = line.strip_prefix("data:") {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut data {
                Some(joined) => {
                    joined.push('\n');
                    joined.push_str(value);
                }
                None => data = Some(value.to_owned()),
            }
        }
    }
    data.filter(|data| data != "[DONE]")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(tap: &mut Tap, chunks: &[&str]) -> String {
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend_from_slice(&tap.feed(&Bytes::from(chunk.to_string())));
        }
        out.extend_from_slice(&tap.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_usage_chunk_the_gateway_asked_for_is_held_back_and_nothing_else() {
        let content = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n";
        let done = "data: [DONE]\n\n";
        // Split mid-event, as the network may.
        let chunks = [&content[..10], &content[10..], usage, done];
        let mut hidden = Tap::new(Shape::OpenaiChat, true);
        assert_eq!(feed_all(&mut hidden, &chunks), format!("{content}{done}"));
        assert_eq!(hidden.report().usage.unwrap().input_tokens, 7);
        let mut shown = Tap::new(Shape::OpenaiChat, false);
        assert_eq!(
            feed_all(&mut shown, &chunks),
            format!("{content}{usage}{done}")
        );
        assert_eq!(shown.report().usage.unwrap().output_tokens, 2);
    }

    #[test]
    fn anthropic_output_is_the_last_delta_not_the_sum() {
        let events = [
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\r\n\r\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":55}}\n\n",
        ];
        let mut tap = Tap::new(Shape::Anthropic, false);
        feed_all(&mut tap, &events);
        let usage = tap.report().usage.unwrap();
        assert_eq!(
            (
                usage.input_tokens,
                usage.cached_input_tokens,
                usage.output_tokens
            ),
            (10, 4, 55)
        );
    }

    #[test]
    fn a_stream_cut_before_its_final_usage_bills_the_output_its_deltas_carried() {
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":13,\"output_tokens\":1}}}\n\n";
        let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"word \"}}\n\n";
        let mut tap = Tap::new(Shape::Anthropic, false);
        let mut chunks = vec![start];
        chunks.extend(std::iter::repeat_n(delta, 200));
        feed_all(&mut tap, &chunks);
        let report = tap.report();
        assert!(!report.complete);
        let usage = report.usage.unwrap();
        // 200 deltas of five characters: 1 000 characters, 250 tokens at four a token.
        assert_eq!((usage.input_tokens, usage.output_tokens), (13, 250));
        // With its final count, the provider's word stands.
        let end = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":180}}\n\n";
        feed_all(&mut tap, &[end]);
        let report = tap.report();
        assert!(report.complete);
        assert_eq!(report.usage.unwrap().output_tokens, 180);
        // A Responses stream cut short: its text deltas counted (9 characters: 3 tokens,
        // but 4 deltas).
        let mut tap = Tap::new(Shape::OpenaiResponses, false);
        let text = "data: {\"type\":\"response.output_text.delta\",\"delta\":\"abc\"}\n\n";
        let created = "data: {\"type\":\"response.in_progress\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\n";
        // An in-progress count is no final one.
        feed_all(&mut tap, &[created, text, text, text, text]);
        let report = tap.report();
        assert_eq!(report.usage.unwrap().output_tokens, 4);
    }
}
