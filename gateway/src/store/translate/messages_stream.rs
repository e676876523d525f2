//! An OpenAI chat completions stream turned into an Anthropic Messages stream as it comes:
//! `message_start` at the first chunk, a text block for content deltas, a `tool_use` block
//! per tool call (its arguments' JSON as `input_json_delta`s), each block stopped when the
//! next begins, then `message_delta` with the stop reason and the usage (from the usage chunk
//! the gateway asked for) and `message_stop`. An `error` object becomes an `error` event.

use bytes::Bytes;
use serde_json::{Value, json};

use super::messages_to_chat::{stop_reason, usage};
use crate::store::sse::{data_of, event_end};

/// The block open now.
#[derive(PartialEq)]
enum Open {
    Nothing,
    Text,
    /// A tool call, by its index in OpenAI's stream.
    Tool(u64),
}

pub struct MessagesStream {
    model: String,
    pending: Vec<u8>,
    started: bool,
    /// Blocks started so far (the next block's index).
    blocks: u64,
    open: Open,
    finish: Option<String>,
    usage: Value,
    done: bool,
}

fn event(kind: &str, data: Value) -> String {
    let mut data = data;
    data["type"] = Value::String(kind.to_owned());
    format!("event: {kind}\ndata: {data}\n\n")
}

impl MessagesStream {
    /// For the public model `model`.
    pub fn new(model: &str) -> MessagesStream {
        MessagesStream {
            model: model.to_owned(),
            pending: Vec::new(),
            started: false,
            blocks: 0,
            open: Open::Nothing,
            finish: None,
            usage: Value::Null,
            done: false,
        }
    }

    /// Takes upstream bytes; returns the Anthropic events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Bytes {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        while let Some(end) = event_end(&self.pending) {
            let raw: Vec<u8> = self.pending.drain(..end).collect();
            match data_of(&raw) {
                Some(data) if data.trim() == "[DONE]" => self.end(&mut out),
                Some(data) => {
                    if let Ok(chunk) = serde_json::from_str::<Value>(&data) {
                        self.translate(&chunk, &mut out);
                    }
                }
                None => {}
            }
        }
        Bytes::from(out)
    }

    /// The end of the upstream: a stream cut short still ends, with what was seen.
    pub fn finish(&mut self) -> Bytes {
        let mut out = String::new();
        self.end(&mut out);
        Bytes::from(out)
    }

    fn translate(&mut self, chunk: &Value, out: &mut String) {
        if self.done {
            return;
        }
        if let Some(error) = chunk.get("error") {
            let message = error["message"]
                .as_str()
                .unwrap_or("the provider's stream failed");
            out.push_str(&event(
                "error",
                json!({ "error": { "type": "api_error", "message": message } }),
            ));
            self.done = true;
            return;
        }
        self.start(chunk, out);
        if chunk.get("usage").is_some_and(Value::is_object) {
            self.usage = chunk["usage"].clone();
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return;
        };
        if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str)
            && !text.is_empty()
        {
            if self.open != Open::Text {
                self.open_block(out, Open::Text, json!({ "type": "text", "text": "" }));
            }
            let delta = json!({ "index": self.blocks - 1, "delta": { "type": "text_delta", "text": text } });
            out.push_str(&event("content_block_delta", delta));
        }
        for call in choice
            .pointer("/delta/tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.tool_call(call, out);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish = Some(reason.to_owned());
        }
    }

    fn start(&mut self, chunk: &Value, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": format!("msg_{}", chunk["id"].as_str().unwrap_or_default()),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": Value::Null,
            "stop_sequence": Value::Null,
            "usage": { "input_tokens": 0, "output_tokens": 0 },
        });
        out.push_str(&event("message_start", json!({ "message": message })));
    }

    fn tool_call(&mut self, call: &Value, out: &mut String) {
        let index = call["index"].as_u64().unwrap_or(0);
        if self.open != Open::Tool(index) {
            let block = json!({
                "type": "tool_use",
                "id": call["id"],
                "name": call.pointer("/function/name").cloned().unwrap_or(Value::Null),
                "input": {},
            });
            self.open_block(out, Open::Tool(index), block);
        }
        if let Some(arguments) = call.pointer("/function/arguments").and_then(Value::as_str)
            && !arguments.is_empty()
        {
            let delta = json!({ "index": self.blocks - 1, "delta": { "type": "input_json_delta", "partial_json": arguments } });
            out.push_str(&event("content_block_delta", delta));
        }
    }

    fn open_block(&mut self, out: &mut String, open: Open, block: Value) {
        self.close_block(out);
        out.push_str(&event(
            "content_block_start",
            json!({ "index": self.blocks, "content_block": block }),
        ));
        self.blocks += 1;
        self.open = open;
    }

    fn close_block(&mut self, out: &mut String) {
        if self.open != Open::Nothing {
            out.push_str(&event(
                "content_block_stop",
                json!({ "index": self.blocks - 1 }),
            ));
            self.open = Open::Nothing;
        }
    }

    fn end(&mut self, out: &mut String) {
        if self.done {
            return;
        }
        self.done = true;
        if !self.started {
            self.start(&Value::Null, out);
        }
        self.close_block(out);
        let counts = usage(&self.usage);
        let delta = json!({
            "delta": { "stop_reason": stop_reason(self.finish.as_deref()), "stop_sequence": Value::Null },
            "usage": counts,
        });
        out.push_str(&event("message_delta", delta));
        out.push_str(&event("message_stop", json!({})));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(stream: &str) -> Vec<(String, Value)> {
        stream
            .split("\n\n")
            .filter(|event| !event.is_empty())
            .map(|event| {
                let (kind, data) = event.split_once('\n').unwrap();
                (
                    kind.trim_start_matches("event: ").to_owned(),
                    serde_json::from_str(data.trim_start_matches("data: ")).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn text_then_a_tool_call_become_two_blocks_whatever_the_byte_boundaries() {
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                json!({ "id": "c1", "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }] })
            )
        };
        let upstream = [
            chunk(json!({ "role": "assistant", "content": "" }), Value::Null),
            chunk(json!({ "content": "Let me " }), Value::Null),
            chunk(json!({ "content": "check." }), Value::Null),
            chunk(json!({ "tool_calls": [{ "index": 0, "id": "call_1", "type": "function", "function": { "name": "w", "arguments": "" } }] }), Value::Null),
            chunk(json!({ "tool_calls": [{ "index": 0, "function": { "arguments": "{\"a\":" } }] }), Value::Null),
            chunk(json!({ "tool_calls": [{ "index": 0, "function": { "arguments": "1}" } }] }), Value::Null),
            chunk(json!({}), json!("tool_calls")),
            format!("data: {}\n\n", json!({ "id": "c1", "choices": [], "usage": { "prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": { "cached_tokens": 4 } } })),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        for size in [1, 5, upstream.len()] {
            let mut stream = MessagesStream::new("openai/gpt");
            let mut out = Vec::new();
            for piece in upstream.as_bytes().chunks(size) {
                out.extend_from_slice(&stream.feed(piece));
            }
            out.extend_from_slice(&stream.finish());
            let seen = events(std::str::from_utf8(&out).unwrap());
            let kinds: Vec<&str> = seen.iter().map(|(kind, _)| kind.as_str()).collect();
            assert_eq!(
                kinds,
                [
                    "message_start",
                    "content_block_start",
                    "content_block_delta",
                    "content_block_delta",
                    "content_block_stop",
                    "content_block_start",
                    "content_block_delta",
                    "content_block_delta",
                    "content_block_stop",
                    "message_delta",
                    "message_stop",
                ]
            );
            assert_eq!(seen[0].1["message"]["id"], "msg_c1");
            assert_eq!(seen[5].1["content_block"]["id"], "call_1");
            assert_eq!(seen[5].1["index"], 1);
            assert_eq!(seen[7].1["delta"]["partial_json"], "1}");
            assert_eq!(seen[9].1["delta"]["stop_reason"], "tool_use");
            assert_eq!(
                seen[9].1["usage"],
                json!({ "input_tokens": 6, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 0, "output_tokens": 5 })
            );
        }
    }
}
