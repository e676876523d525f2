//! A model's answer read as it streams (server-sent events, in the family's wire form):
//! the events cut from the bytes as they come, each turned into the pieces of text, thinking
//! and tool-call arguments it adds ([`Delta`]), and the whole answer put back together at
//! the end — the body the same call would have answered unstreamed, read by
//! [`crate::model::parse_answer`], so a streamed answer and a whole one are read alike.

use serde_json::{Map, Value, json};

pub use crate::delta::{Delta, DeltaKind};
use crate::model::{Family, ModelAnswer, parse_answer};

/// One server-sent event: its `event:` name, if it had one, and its `data:` lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Cuts server-sent events out of bytes as they arrive (lines ending in LF or CRLF).
#[derive(Debug, Default)]
pub struct SseReader {
    line: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
}

impl SseReader {
    /// The events `bytes` completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in bytes {
            if byte != b'\n' {
                self.line.push(byte);
                continue;
            }
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    events.push(SseEvent {
                        event: self.event.take(),
                        data,
                    });
                }
                self.event = None;
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_owned()),
                },
                "event" => self.event = Some(value.to_owned()),
                _ => {}
            }
        }
        events
    }
}

/// A chat stream's tool call, as its pieces came.
#[derive(Debug, Default)]
struct ChatCall {
    id: String,
    name: String,
    arguments: String,
    part: usize,
}

/// An Anthropic stream's content block, as its pieces came.
#[derive(Debug)]
struct Block {
    block: Map<String, Value>,
    part: Option<usize>,
    partial_json: String,
}

/// Puts a streamed answer back together, piece by piece.
#[derive(Debug)]
pub struct Assembler {
    family: Family,
    done: bool,
    text: String,
    calls: Vec<ChatCall>,
    finish_reason: Option<String>,
    usage: Value,
    message: Map<String, Value>,
    blocks: Vec<Block>,
    announced: Vec<usize>,
}

impl Assembler {
    pub fn new(family: Family) -> Assembler {
        Assembler {
            family,
            done: false,
            text: String::new(),
            calls: Vec::new(),
            finish_reason: None,
            usage: Value::Null,
            message: Map::new(),
            blocks: Vec::new(),
            announced: Vec::new(),
        }
    }

    /// The pieces `event` adds; an error when the stream said it failed.
    pub fn event(&mut self, event: &SseEvent) -> Result<Vec<Delta>, String> {
        if event.data == "[DONE]" {
            self.done = true;
            return Ok(Vec::new());
        }
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            return Err(format!(
                "the model's stream sent what is not JSON: {}",
                event.data
            ));
        };
        if data.get("error").is_some_and(|error| !error.is_null()) {
            let error = &data["error"];
            let message = error["message"]
                .as_str()
                .unwrap_or("the model's stream failed");
            return Err(message.to_owned());
        }
        Ok(match self.family {
            Family::OpenAi => self.chunk(&data),
            Family::Anthropic => self.anthropic(&data),
        })
    }

    /// The whole answer, or `None` when the stream had not ended.
    pub fn finish(self) -> Option<ModelAnswer> {
        match self.family {
            Family::OpenAi => {
                let finish = self.finish_reason?;
                let calls: Vec<Value> = self
                    .calls
                    .iter()
                    .map(|call| {
                        json!({ "id": call.id, "type": "function",
                                "function": { "name": call.name, "arguments": call.arguments } })
                    })
                    .collect();
                let mut message = json!({ "role": "assistant", "content": self.text });
                if !calls.is_empty() {
                    message["tool_calls"] = Value::Array(calls);
                }
                let body = json!({ "choices": [{ "index": 0, "message": message,
                                                 "finish_reason": finish }],
                                   "usage": self.usage });
                parse_answer(Family::OpenAi, &body)
            }
            Family::Anthropic => {
                if !self.done {
                    return None;
                }
                let mut message = self.message;
                let content = self
                    .blocks
                    .into_iter()
                    .map(|block| Value::Object(block.block));
                message.insert("content".into(), Value::Array(content.collect()));
                parse_answer(Family::Anthropic, &Value::Object(message))
            }
        }
    }

    /// A chat completion chunk.
    fn chunk(&mut self, data: &Value) -> Vec<Delta> {
        if data["usage"].is_object() {
            self.usage = data["usage"].clone();
        }
        let Some(choice) = data["choices"].get(0) else {
            return Vec::new();
        };
        if let Some(finish) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(finish.to_owned());
        }
        let delta = &choice["delta"];
        let mut deltas = Vec::new();
        if let Some(text) = delta["content"].as_str().filter(|text| !text.is_empty()) {
            self.text.push_str(text);
            deltas.push(self.piece(0, DeltaKind::Text, text, None));
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0) as usize;
            while self.calls.len() <= index {
                // Parts: the text (when there is some) first, then the calls in order.
                let part = self.calls.len() + usize::from(!self.text.is_empty());
                self.calls.push(ChatCall {
                    part,
                    ..ChatCall::default()
                });
            }
            let entry = &mut self.calls[index];
            if let Some(id) = call["id"].as_str() {
                entry.id = id.to_owned();
            }
            if let Some(name) = call["function"]["name"].as_str() {
                entry.name.push_str(name);
            }
            let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
            entry.arguments.push_str(arguments);
            let (part, named) = (entry.part, (entry.id.clone(), entry.name.clone()));
            if !arguments.is_empty() {
                deltas.push(self.piece(part, DeltaKind::Arguments, arguments, Some(named)));
            }
        }
        deltas
    }

    /// An Anthropic message stream's event.
    fn anthropic(&mut self, data: &Value) -> Vec<Delta> {
        match data["type"].as_str().unwrap_or_default() {
            "message_start" => {
                if let Some(message) = data["message"].as_object() {
                    self.message = message.clone();
                }
                Vec::new()
            }
            "content_block_start" => {
                let block = data["content_block"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                let kept = matches!(
                    block.get("type").and_then(Value::as_str),
                    Some("text" | "thinking" | "tool_use")
                );
                let part = kept.then(|| self.blocks.iter().filter(|b| b.part.is_some()).count());
                self.blocks.push(Block {
                    block,
                    part,
                    partial_json: String::new(),
                });
                Vec::new()
            }
            "content_block_delta" => self.block_delta(data),
            "content_block_stop" => {
                if let Some(block) = self.blocks.last_mut()
                    && block.block.get("type").and_then(Value::as_str) == Some("tool_use")
                {
                    let text = std::mem::take(&mut block.partial_json);
                    let input = serde_json::from_str(&text).unwrap_or_else(|_| json!({}));
                    block.block.insert("input".into(), input);
                }
                Vec::new()
            }
            "message_delta" => {
                for (field, value) in data["delta"].as_object().into_iter().flatten() {
                    self.message.insert(field.clone(), value.clone());
                }
                if let Some(usage) = data["usage"].as_object() {
                    let entry = self.message.entry("usage").or_insert_with(|| json!({}));
                    for (field, value) in usage.iter().filter(|(_, value)| !value.is_null()) {
                        entry[field] = value.clone();
                    }
                }
                Vec::new()
            }
            "message_stop" => {
                self.done = true;
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn block_delta(&mut self, data: &Value) -> Vec<Delta> {
        let index = data["index"].as_u64().unwrap_or(0) as usize;
        let delta = &data["delta"];
        let Some(block) = self.blocks.get_mut(index) else {
            return Vec::new();
        };
        let (field, kind) = match delta["type"].as_str().unwrap_or_default() {
            "text_delta" => ("text", DeltaKind::Text),
            "thinking_delta" => ("thinking", DeltaKind::Thinking),
            "input_json_delta" => ("partial_json", DeltaKind::Arguments),
            "signature_delta" => {
                block
                    .block
                    .insert("signature".into(), delta["signature"].clone());
                return Vec::new();
            }
            _ => return Vec::new(),
        };
        let piece = delta[field].as_str().unwrap_or_default().to_owned();
        if kind == DeltaKind::Arguments {
            block.partial_json.push_str(&piece);
        } else {
            let mut text = block.block[field].as_str().unwrap_or_default().to_owned();
            text.push_str(&piece);
            block.block.insert(field.into(), Value::String(text));
        }
        let (Some(part), false) = (block.part, piece.is_empty()) else {
            return Vec::new();
        };
        let named = (kind == DeltaKind::Arguments).then(|| {
            let field = |name: &str| block.block[name].as_str().unwrap_or_default().to_owned();
            (field("id"), field("name"))
        });
        vec![self.piece(part, kind, &piece, named)]
    }

    /// A piece of `part`; the call is named on the part's first piece only.
    fn piece(
        &mut self,
        part: usize,
        kind: DeltaKind,
        text: &str,
        call: Option<(String, String)>,
    ) -> Delta {
        let first = !self.announced.contains(&part);
        if first {
            self.announced.push(part);
        }
        Delta {
            part,
            kind,
            text: text.to_owned(),
            call: call.filter(|_| first),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbase_api::conversation::Part;

    fn feed(family: Family, wire: &str) -> (Vec<Delta>, Option<ModelAnswer>) {
        let mut reader = SseReader::default();
        let mut assembler = Assembler::new(family);
        let mut deltas = Vec::new();
        // Bytes cut anywhere: one at a time.
        for byte in wire.as_bytes() {
            for event in reader.push(std::slice::from_ref(byte)) {
                deltas.extend(assembler.event(&event).expect("event"));
            }
        }
        (deltas, assembler.finish())
    }

    #[test]
    fn a_chat_stream_becomes_the_answer_it_would_have_been_whole() {
        let wire = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Let \"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"me.\"}}]}\r\n\r\n",
            ": a comment\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"shell\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"command\\\":\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"ls\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n",
            "data: [DONE]\n\n",
        );
        let (deltas, answer) = feed(Family::OpenAi, wire);
        let answer = answer.expect("ended");
        assert_eq!(answer.text(), "Let me.");
        assert_eq!(answer.stop_reason, "tool_calls");
        assert_eq!(answer.usage.input_tokens, 9);
        assert_eq!(answer.usage.output_tokens, 4);
        let calls = answer.tool_calls();
        assert_eq!(calls[0].arguments, json!({ "command": "ls" }));
        let kinds: Vec<(usize, DeltaKind, &str)> = deltas
            .iter()
            .map(|delta| (delta.part, delta.kind, delta.text.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (0, DeltaKind::Text, "Let "),
                (0, DeltaKind::Text, "me."),
                (1, DeltaKind::Arguments, "{\"command\":"),
                (1, DeltaKind::Arguments, "\"ls\"}"),
            ]
        );
        assert_eq!(deltas[2].call, Some(("call_1".into(), "shell".into())));
        assert_eq!(deltas[3].call, None);
    }

    #[test]
    fn an_anthropic_stream_becomes_the_answer_it_would_have_been_whole() {
        let events = [
            json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"stop_reason":null,"usage":{"input_tokens":12,"output_tokens":1,"cache_read_input_tokens":3}}}),
            json!({"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hm."}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}),
            json!({"type":"content_block_stop","index":0}),
            json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"shell","input":{}}}),
            json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"command\""}}),
            json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":": \"pwd\"}"}}),
            json!({"type":"content_block_stop","index":1}),
            json!({"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":30}}),
            json!({"type":"message_stop"}),
        ];
        let wire: String = events
            .iter()
            .map(|event| {
                format!(
                    "event: {}\ndata: {event}\n\n",
                    event["type"].as_str().unwrap()
                )
            })
            .collect();
        let (deltas, answer) = feed(Family::Anthropic, &wire);
        let answer = answer.expect("ended");
        assert_eq!(answer.stop_reason, "tool_use");
        assert_eq!(answer.usage.input_tokens, 12);
        assert_eq!(answer.usage.cached_input_tokens, 3);
        assert_eq!(answer.usage.output_tokens, 30);
        assert_eq!(
            answer.message.content[0],
            Part::Thinking {
                thinking: "Hm.".into(),
                signature: Some("SIG".into())
            }
        );
        assert_eq!(
            answer.tool_calls()[0].arguments,
            json!({ "command": "pwd" })
        );
        assert_eq!(deltas.len(), 3);
        assert_eq!((deltas[0].part, deltas[0].kind), (0, DeltaKind::Thinking));
        assert_eq!(deltas[1].call, Some(("toolu_1".into(), "shell".into())));
    }

    #[test]
    fn a_stream_cut_short_or_failing_is_no_answer() {
        let (_, answer) = feed(
            Family::OpenAi,
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
        );
        assert!(answer.is_none());
        let (_, answer) = feed(
            Family::Anthropic,
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[]}}\n\n",
        );
        assert!(answer.is_none());
        let mut assembler = Assembler::new(Family::Anthropic);
        let failed = SseEvent {
            event: Some("error".into()),
            data: r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
                .into(),
        };
        assert_eq!(assembler.event(&failed), Err("Overloaded".into()));
    }
}
