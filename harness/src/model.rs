//! A model call in the wire form of the model's family, through the store's routes
//! (`/openai/v1/chat/completions`, `/anthropic/v1/messages`), and its answer read back into
//! the typed conversation. Anthropic-family requests mark the stable prefix (the system
//! prompt and the tools) for prompt caching.

use sandbase_api::conversation::{Message, Part, Role, ToolCall, Usage};
use serde_json::{Value, json};

use crate::tools::ToolDef;

/// The wire form a model speaks (the store's `family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    OpenAi,
    Anthropic,
}

impl Family {
    pub fn parse(family: &str) -> Family {
        if family == "anthropic" {
            Family::Anthropic
        } else {
            Family::OpenAi
        }
    }

    /// The store route a request of this family goes to.
    pub fn path(self) -> &'static str {
        match self {
            Family::OpenAi => "/openai/v1/chat/completions",
            Family::Anthropic => "/anthropic/v1/messages",
        }
    }
}

/// A model's prices as the store lists them, in micro-credits per million tokens of each
/// kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prices {
    pub input: i64,
    pub cached_input: i64,
    pub cache_write: i64,
    pub output: i64,
}

impl Prices {
    /// From an entry of `GET /v1/store/models` (`prices`: credits per million, decimals).
    pub fn from_listing(model: &Value) -> Prices {
        let price = |kind: &str| micro(model["prices"][kind].as_str().unwrap_or("0"));
        Prices {
            input: price("input"),
            cached_input: price("cached_input"),
            cache_write: price("cache_write"),
            output: price("output"),
        }
    }

    /// What `usage` costs, rounded up once over the call — as the store charges it.
    pub fn cost(&self, usage: &Usage) -> i64 {
        let part = |tokens: u64, price: i64| u128::from(tokens) * price.max(0) as u128;
        let total = part(usage.input_tokens, self.input)
            + part(usage.cached_input_tokens, self.cached_input)
            + part(usage.cache_write_tokens, self.cache_write)
            + part(usage.output_tokens, self.output);
        i64::try_from(total.div_ceil(1_000_000)).unwrap_or(i64::MAX)
    }
}

/// Micro-credits of a decimal amount of credits (`"2.50"` → 2 500 000); 0 when unreadable.
fn micro(text: &str) -> i64 {
    let (whole, fraction) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
    let fraction: String = fraction
        .chars()
        .chain(std::iter::repeat('0'))
        .take(6)
        .collect();
    match (whole.parse::<i64>(), fraction.parse::<i64>()) {
        (Ok(whole), Ok(fraction)) => whole.saturating_mul(1_000_000).saturating_add(fraction),
        _ => 0,
    }
}

/// What a model is asked.
pub struct ModelRequest<'a> {
    pub model: &'a str,
    pub family: Family,
    pub system: &'a str,
    pub conversation: &'a [Message],
    pub tools: &'a [ToolDef],
    /// The most output tokens asked for (Anthropic requires one).
    pub max_output: u64,
    pub parallel_tool_calls: bool,
}

/// What a model answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelAnswer {
    /// The assistant's message: text, thinking, tool calls.
    pub message: Message,
    /// Why it stopped, in the family's words (`stop`, `tool_calls`, `end_turn`, `tool_use`…).
    pub stop_reason: String,
    pub usage: Usage,
}

impl ModelAnswer {
    pub fn tool_calls(&self) -> Vec<&ToolCall> {
        self.message
            .content
            .iter()
            .filter_map(|part| match part {
                Part::ToolCall(call) => Some(call),
                _ => None,
            })
            .collect()
    }

    pub fn text(&self) -> String {
        self.message
            .content
            .iter()
            .filter_map(|part| match part {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

impl ModelRequest<'_> {
    /// The request body for the family's store route.
    pub fn body(&self) -> Value {
        match self.family {
            Family::OpenAi => self.chat(),
            Family::Anthropic => self.messages(),
        }
    }

    /// The request body asking for the answer as a stream of events (with its usage at the
    /// end, where a family must be asked for it).
    pub fn streamed(&self) -> Value {
        let mut body = self.body();
        body["stream"] = json!(true);
        if self.family == Family::OpenAi {
            body["stream_options"] = json!({ "include_usage": true });
        }
        body
    }

    fn chat(&self) -> Value {
        let mut messages = vec![json!({ "role": "system", "content": self.system })];
        for message in self.conversation {
            messages.extend(chat_messages(message));
        }
        let mut body = json!({ "model": self.model, "messages": messages });
        if !self.tools.is_empty() {
            body["tools"] = self
                .tools
                .iter()
                .map(|tool| {
                    json!({ "type": "function", "function": {
                        "name": tool.name, "description": tool.description,
                        "parameters": tool.parameters } })
                })
                .collect();
            body["parallel_tool_calls"] = json!(self.parallel_tool_calls);
        }
        body
    }

    fn messages(&self) -> Value {
        let messages: Vec<Value> = self
            .conversation
            .iter()
            .filter(|message| message.role != Role::System)
            .map(anthropic_message)
            .collect();
        // The stable prefix (system prompt, tools) is marked for the provider's cache.
        let system = json!([{ "type": "text", "text": self.system,
                              "cache_control": { "type": "ephemeral" } }]);
        let mut body = json!({ "model": self.model, "max_tokens": self.max_output,
                               "system": system, "messages": messages });
        if !self.tools.is_empty() {
            let mut tools: Vec<Value> = self
                .tools
                .iter()
                .map(|tool| {
                    json!({ "name": tool.name, "description": tool.description,
                            "input_schema": tool.parameters })
                })
                .collect();
            if let Some(last) = tools.last_mut() {
                last["cache_control"] = json!({ "type": "ephemeral" });
            }
            body["tools"] = Value::Array(tools);
            if !self.parallel_tool_calls {
                body["tool_choice"] = json!({ "type": "auto", "disable_parallel_tool_use": true });
            }
        }
        body
    }
}

/// A message of the conversation as chat messages: tool results become `tool` messages.
fn chat_messages(message: &Message) -> Vec<Value> {
    let text: String = message
        .content
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    match message.role {
        Role::Assistant => {
            let calls: Vec<Value> = message
                .content
                .iter()
                .filter_map(|part| match part {
                    Part::ToolCall(call) => Some(call.to_chat()),
                    _ => None,
                })
                .collect();
            let mut entry = json!({ "role": "assistant",
                                    "content": if text.is_empty() { Value::Null } else { json!(text) } });
            if !calls.is_empty() {
                entry["tool_calls"] = Value::Array(calls);
            }
            out.push(entry);
        }
        Role::User | Role::System => {
            for part in &message.content {
                if let Part::ToolResult(result) = part {
                    out.push(json!({ "role": "tool", "tool_call_id": result.call_id,
                                     "content": result.content }));
                }
            }
            if !text.is_empty() {
                let role = if message.role == Role::System {
                    "system"
                } else {
                    "user"
                };
                out.push(json!({ "role": role, "content": text }));
            }
        }
    }
    out
}

fn anthropic_message(message: &Message) -> Value {
    let blocks: Vec<Value> = message
        .content
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } if !text.is_empty() => {
                Some(json!({ "type": "text", "text": text }))
            }
            Part::Text { .. } | Part::Image { .. } => None,
            Part::Thinking {
                thinking,
                signature,
            } => Some(json!({ "type": "thinking", "thinking": thinking, "signature": signature })),
            Part::ToolCall(call) => Some(call.to_tool_use()),
            Part::ToolResult(result) => Some(json!({
                "type": "tool_result", "tool_use_id": result.call_id,
                "content": result.content, "is_error": result.is_error })),
        })
        .collect();
    let role = if message.role == Role::Assistant {
        "assistant"
    } else {
        "user"
    };
    json!({ "role": role, "content": blocks })
}

/// The answer of the family's route, read back; `None` when it is not such an answer.
pub fn parse_answer(family: Family, body: &Value) -> Option<ModelAnswer> {
    match family {
        Family::OpenAi => parse_chat(body),
        Family::Anthropic => parse_messages(body),
    }
}

fn parse_chat(body: &Value) -> Option<ModelAnswer> {
    let choice = body.get("choices")?.get(0)?;
    let message = choice.get("message")?;
    let mut content = Vec::new();
    if let Some(text) = message["content"].as_str().filter(|text| !text.is_empty()) {
        content.push(Part::Text {
            text: text.to_owned(),
        });
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        content.push(Part::ToolCall(ToolCall::from_chat_answer(call)));
    }
    let usage = &body["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = usage
        .pointer("/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Some(ModelAnswer {
        message: Message {
            role: Role::Assistant,
            content,
        },
        stop_reason: choice["finish_reason"]
            .as_str()
            .unwrap_or("stop")
            .to_owned(),
        usage: Usage {
            input_tokens: prompt.saturating_sub(cached),
            cached_input_tokens: cached,
            cache_write_tokens: 0,
            output_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
        },
    })
}

fn parse_messages(body: &Value) -> Option<ModelAnswer> {
    let blocks = body.get("content")?.as_array()?;
    let content = blocks
        .iter()
        .filter_map(|block| match block["type"].as_str() {
            Some("text") => Some(Part::Text {
                text: block["text"].as_str().unwrap_or_default().to_owned(),
            }),
            Some("thinking") => Some(Part::Thinking {
                thinking: block["thinking"].as_str().unwrap_or_default().to_owned(),
                signature: block["signature"].as_str().map(str::to_owned),
            }),
            Some("tool_use") => Some(Part::ToolCall(ToolCall::from_tool_use(block))),
            _ => None,
        })
        .collect();
    let usage = &body["usage"];
    let count = |field: &str| usage[field].as_u64().unwrap_or(0);
    Some(ModelAnswer {
        message: Message {
            role: Role::Assistant,
            content,
        },
        stop_reason: body["stop_reason"]
            .as_str()
            .unwrap_or("end_turn")
            .to_owned(),
        usage: Usage {
            input_tokens: count("input_tokens"),
            cached_input_tokens: count("cache_read_input_tokens"),
            cache_write_tokens: count("cache_creation_input_tokens"),
            output_tokens: count("output_tokens"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbase_api::conversation::ToolResult;

    fn conversation() -> Vec<Message> {
        vec![
            Message {
                role: Role::User,
                content: vec![Part::Text {
                    text: "list".into(),
                }],
            },
            Message {
                role: Role::Assistant,
                content: vec![Part::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "shell".into(),
                    arguments: json!({ "command": "ls" }),
                })],
            },
            Message {
                role: Role::User,
                content: vec![Part::ToolResult(ToolResult {
                    call_id: "c1".into(),
                    content: "a.txt".into(),
                    is_error: false,
                })],
            },
        ]
    }

    fn request<'a>(family: Family, messages: &'a [Message], tools: &'a [ToolDef]) -> Value {
        ModelRequest {
            model: "m",
            family,
            system: "be brief",
            conversation: messages,
            tools,
            max_output: 1000,
            parallel_tool_calls: true,
        }
        .body()
    }

    #[test]
    fn a_conversation_with_a_tool_call_is_written_in_both_families() {
        let messages = conversation();
        let tools = crate::tools::definitions(&[sandbase_api::agent_runs::AgentTool::Shell]);
        let chat = request(Family::OpenAi, &messages, &tools);
        assert_eq!(chat["messages"][0]["role"], "system");
        assert_eq!(
            chat["messages"][2]["tool_calls"][0]["function"]["name"],
            "shell"
        );
        assert_eq!(
            chat["messages"][3],
            json!({ "role": "tool", "tool_call_id": "c1", "content": "a.txt" })
        );
        assert_eq!(chat["tools"][0]["function"]["name"], "shell");
        let anthropic = request(Family::Anthropic, &messages, &tools);
        assert_eq!(anthropic["system"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(anthropic["messages"][1]["content"][0]["type"], "tool_use");
        assert_eq!(anthropic["messages"][2]["content"][0]["tool_use_id"], "c1");
        assert_eq!(anthropic["tools"][0]["cache_control"]["type"], "ephemeral");
    }

    #[test]
    fn a_call_is_priced_as_the_store_prices_it() {
        let listing = json!({ "prices": { "input": "2.50", "cached_input": "1.25",
                                          "cache_write": "0", "output": "10" } });
        let prices = Prices::from_listing(&listing);
        assert_eq!(prices.input, 2_500_000);
        let usage = Usage {
            input_tokens: 800,
            cached_input_tokens: 200,
            cache_write_tokens: 0,
            output_tokens: 50,
        };
        // 800 × 2.5 + 200 × 1.25 + 50 × 10 = 2750 micro-credits.
        assert_eq!(prices.cost(&usage), 2750);
    }

    #[test]
    fn answers_of_both_families_read_back_as_tool_calls_and_usage() {
        let chat = json!({ "choices": [{ "finish_reason": "tool_calls", "message": {
            "content": null, "tool_calls": [{ "id": "c2", "type": "function",
            "function": { "name": "shell", "arguments": "{\"command\":\"pwd\"}" } }] } }],
            "usage": { "prompt_tokens": 100, "completion_tokens": 5,
                       "prompt_tokens_details": { "cached_tokens": 40 } } });
        let answer = parse_answer(Family::OpenAi, &chat).expect("a chat answer");
        assert_eq!(
            answer.tool_calls()[0].arguments,
            json!({ "command": "pwd" })
        );
        assert_eq!(
            (answer.usage.input_tokens, answer.usage.cached_input_tokens),
            (60, 40)
        );
        let messages = json!({ "stop_reason": "end_turn", "content": [{ "type": "text", "text": "done" }],
            "usage": { "input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 7 } });
        let answer = parse_answer(Family::Anthropic, &messages).expect("a messages answer");
        assert_eq!(answer.text(), "done");
        assert_eq!(answer.usage.cached_input_tokens, 7);
        assert!(parse_answer(Family::OpenAi, &json!({ "error": {} })).is_none());
    }
}
