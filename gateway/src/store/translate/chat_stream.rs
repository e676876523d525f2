//! An Anthropic Messages stream turned into an OpenAI chat completions stream as it comes:
//! the role first, text deltas as content deltas, each tool use as a tool call (its id and
//! name, then its arguments' JSON in pieces), the stop reason as the finish reason, the usage
//! as a last chunk when the client asked for it (`stream_options.include_usage`), then
//! `[DONE]`. An `error` event becomes a chunk with an `error` object, as OpenAI streams
//! carry them.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{Value, json};

use super::chat_to_messages::{finish_reason, usage};
use crate::store::sse::{data_of, event_end};

pub struct ChatStream {
    model: String,
    include_usage: bool,
    created: i64,
    id: String,
    pending: Vec<u8>,
    /// Anthropic's content block index → the tool call's index.
    tools: HashMap<u64, usize>,
    /// The counts so far (Anthropic's are cumulative: the last report wins).
    usage: serde_json::Map<String, Value>,
    stop_reason: Option<String>,
    done: bool,
}

impl ChatStream {
    /// For the public model `model`; `include_usage` as the client asked.
    pub fn new(model: &str, include_usage: bool) -> ChatStream {
        ChatStream {
            model: model.to_owned(),
            include_usage,
            created: chrono::Utc::now().timestamp(),
            id: "chatcmpl-".to_owned(),
            pending: Vec::new(),
            tools: HashMap::new(),
            usage: serde_json::Map::new(),
            stop_reason: None,
            done: false,
        }
    }

    /// Takes upstream bytes; returns the OpenAI events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Bytes {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        while let Some(end) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end).collect();
            if let Some(data) = data_of(&event)
                && let Ok(data) = serde_json::from_str::<Value>(&data)
            {
                self.translate(&data, &mut out);
            }
        }
        Bytes::from(out)
    }

    /// The end of the upstream: a stream cut short still ends, with what was seen.
    pub fn finish(&mut self) -> Bytes {
        let mut out = String::new();
        if !self.done {
            self.end(&mut out);
        }
        Bytes::from(out)
    }

    fn translate(&mut self, data: &Value, out: &mut String) {
        match data["type"].as_str() {
            Some("message_start") => {
                let message = &data["message"];
                self.id = format!("chatcmpl-{}", message["id"].as_str().unwrap_or_default());
                self.count(&message["usage"]);
                self.chunk(out, json!({ "role": "assistant", "content": "" }), None);
            }
            Some("content_block_start") => self.block_start(data, out),
            Some("content_block_delta") => self.block_delta(data, out),
            Some("message_delta") => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                self.count(&data["usage"]);
            }
            Some("message_stop") => self.end(out),
            Some("error") => {
                let error = &data["error"];
                let event = json!({ "error": {
                    "message": error["message"].as_str().unwrap_or("the provider's stream failed"),
                    "type": error["type"].as_str().unwrap_or("api_error"),
                    "param": Value::Null,
                    "code": Value::Null,
                }});
                out.push_str(&format!("data: {event}\n\n"));
                self.done = true;
            }
            _ => {}
        }
    }

    fn block_start(&mut self, data: &Value, out: &mut String) {
        let block = &data["content_block"];
        match block["type"].as_str() {
            Some("tool_use") => {
                let index = self.tools.len();
                self.tools
                    .insert(data["index"].as_u64().unwrap_or(0), index);
                let call = json!({
                    "index": index,
                    "id": block["id"],
                    "type": "function",
                    "function": { "name": block["name"], "arguments": "" },
                });
                self.chunk(out, json!({ "tool_calls": [call] }), None);
            }
            Some("text") => {
                if let Some(text) = block["text"].as_str().filter(|text| !text.is_empty()) {
                    self.chunk(out, json!({ "content": text }), None);
                }
            }
            _ => {}
        }
    }

    fn block_delta(&mut self, data: &Value, out: &mut String) {
        let delta = &data["delta"];
        match delta["type"].as_str() {
            Some("text_delta") => {
                self.chunk(out, json!({ "content": delta["text"] }), None);
            }
            Some("input_json_delta") => {
                let Some(&index) = data["index"].as_u64().and_then(|at| self.tools.get(&at)) else {
                    return;
                };
                let call = json!({
                    "index": index,
                    "function": { "arguments": delta["partial_json"] },
                });
                self.chunk(out, json!({ "tool_calls": [call] }), None);
            }
            _ => {}
        }
    }

    fn count(&mut self, counts: &Value) {
        if let Some(counts) = counts.as_object() {
            for (name, value) in counts {
                if value.is_u64() {
                    self.usage.insert(name.clone(), value.clone());
                }
            }
        }
    }

    /// The finish reason, the usage when asked for, `[DONE]`.
    fn end(&mut self, out: &mut String) {
        let reason = finish_reason(self.stop_reason.as_deref());
        self.chunk(out, json!({}), Some(reason));
        if self.include_usage {
            let chunk = json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(&Value::Object(self.usage.clone())),
            });
            out.push_str(&format!("data: {chunk}\n\n"));
        }
        out.push_str("data: [DONE]\n\n");
        self.done = true;
    }

    fn chunk(&self, out: &mut String, delta: Value, finish: Option<&str>) {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish, "logprobs": Value::Null }],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        out.push_str(&format!("data: {chunk}\n\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(stream: &str) -> Vec<Value> {
        stream
            .split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .map(|data| serde_json::from_str(data).unwrap_or(Value::String(data.to_owned())))
            .collect()
    }

    #[test]
    fn text_and_a_tool_call_arrive_as_openai_chunks_whatever_the_byte_boundaries() {
        let upstream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
            "event: ping\ndata: {\"type\":\"ping\"}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"add\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\": 1\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"}\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":7}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        for size in [1, 7, upstream.len()] {
            let mut stream = ChatStream::new("anthropic/claude", true);
            let mut out = Vec::new();
            for piece in upstream.as_bytes().chunks(size) {
                out.extend_from_slice(&stream.feed(piece));
            }
            out.extend_from_slice(&stream.finish());
            let seen = events(std::str::from_utf8(&out).unwrap());
            assert_eq!(seen[0]["choices"][0]["delta"]["role"], "assistant");
            assert_eq!(seen[1]["choices"][0]["delta"]["content"], "Hi");
            assert_eq!(
                seen[2]["choices"][0]["delta"]["tool_calls"][0]["id"],
                "toolu_1"
            );
            let arguments: String = seen[3..5]
                .iter()
                .map(|chunk| {
                    chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect();
            assert_eq!(arguments, "{\"a\": 1}");
            assert_eq!(seen[5]["choices"][0]["finish_reason"], "tool_calls");
            assert_eq!(seen[6]["usage"]["prompt_tokens"], 14);
            assert_eq!(seen[6]["usage"]["completion_tokens"], 7);
            assert_eq!(seen[7], Value::String("[DONE]".to_owned()));
            assert_eq!(seen.len(), 8);
        }
    }
}
