//! A conversation with a model, in one typed form whatever the model's family: messages of
//! text, images, tool calls and tool results, and the usage a call reports. The store's
//! translation between the families goes through it for tool calls (one conversion each
//! way, `ToolCall`), and the harness keeps its conversations in it. Pure data: serde, no
//! HTTP, no vendor client.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Who says a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions (OpenAI's `system`/`developer`, Anthropic's `system`).
    System,
    User,
    Assistant,
}

/// One message: who says it and what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Part>,
}

/// A piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
    },
    /// An image, as a URL (`https:` or `data:`).
    Image {
        url: String,
    },
    /// The model's reasoning, with the provider's signature when it gave one (sent back only
    /// to a model of the same family).
    Thinking {
        thinking: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    ToolCall(ToolCall),
    ToolResult(ToolResult),
}

/// A tool call a model made: its id, the tool's name and its arguments (a JSON object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// What a tool answered a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: String,
    pub content: String,
    #[serde(default)]
    pub is_error: bool,
}

/// The tokens a call used, in four kinds (what prices are per).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    /// Input tokens read fresh (not from a cache, not written to one).
    pub input_tokens: u64,
    /// Input tokens read from the provider's prompt cache.
    pub cached_input_tokens: u64,
    /// Input tokens written to the provider's prompt cache.
    pub cache_write_tokens: u64,
    pub output_tokens: u64,
}

impl ToolCall {
    /// From an entry of an OpenAI chat message's `tool_calls` (`{id, type: "function",
    /// function: {name, arguments}}`, the arguments a JSON text; empty means `{}`). Arguments
    /// that are not JSON are refused.
    pub fn from_chat(call: &Value) -> Result<ToolCall, String> {
        let arguments = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or("{}");
        let arguments = if arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(arguments)
                .map_err(|_| "a tool call's `arguments` are not JSON".to_owned())?
        };
        Ok(ToolCall::named_in_chat(call, arguments))
    }

    /// The same, for a model's answer: arguments that are not JSON read as `{}` (the model's
    /// answer is passed on rather than refused).
    pub fn from_chat_answer(call: &Value) -> ToolCall {
        ToolCall::from_chat(call).unwrap_or_else(|_| ToolCall::named_in_chat(call, json!({})))
    }

    /// The id and name of a chat `tool_calls` entry, with `arguments`.
    fn named_in_chat(call: &Value, arguments: Value) -> ToolCall {
        ToolCall {
            id: call["id"].as_str().unwrap_or_default().to_owned(),
            name: call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            arguments,
        }
    }

    /// As an entry of an OpenAI chat message's `tool_calls`.
    pub fn to_chat(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": { "name": self.name, "arguments": self.arguments.to_string() },
        })
    }

    /// From an Anthropic `tool_use` block (`{id, name, input}`).
    pub fn from_tool_use(block: &Value) -> ToolCall {
        ToolCall {
            id: block["id"].as_str().unwrap_or_default().to_owned(),
            name: block["name"].as_str().unwrap_or_default().to_owned(),
            arguments: block.get("input").cloned().unwrap_or_else(|| json!({})),
        }
    }

    /// As an Anthropic `tool_use` block.
    pub fn to_tool_use(&self) -> Value {
        json!({ "type": "tool_use", "id": self.id, "name": self.name, "input": self.arguments })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_call_goes_round_both_families_unchanged() {
        let chat = json!({
            "id": "call_1", "type": "function",
            "function": { "name": "shell", "arguments": "{\"command\":\"ls\"}" },
        });
        let call = ToolCall::from_chat(&chat).expect("a chat tool call");
        assert_eq!(call.arguments, json!({ "command": "ls" }));
        let block = call.to_tool_use();
        assert_eq!(
            block,
            json!({ "type": "tool_use", "id": "call_1", "name": "shell", "input": { "command": "ls" } })
        );
        assert_eq!(ToolCall::from_tool_use(&block), call);
        assert_eq!(
            ToolCall::from_chat(&call.to_chat()).expect("its own chat form"),
            call
        );
    }

    #[test]
    fn arguments_that_are_not_json_are_refused_in_a_request_and_empty_in_an_answer() {
        let bad = json!({ "id": "c", "function": { "name": "f", "arguments": "{oops" } });
        assert!(ToolCall::from_chat(&bad).is_err());
        assert_eq!(ToolCall::from_chat_answer(&bad).arguments, json!({}));
        let empty = json!({ "id": "c", "function": { "name": "f", "arguments": " " } });
        assert_eq!(
            ToolCall::from_chat(&empty)
                .expect("empty arguments")
                .arguments,
            json!({})
        );
    }

    #[test]
    fn a_conversation_reads_back_as_it_was_written() {
        let message = Message {
            role: Role::Assistant,
            content: vec![
                Part::Thinking {
                    thinking: "list first".to_owned(),
                    signature: Some("sig".to_owned()),
                },
                Part::ToolCall(ToolCall {
                    id: "c1".to_owned(),
                    name: "shell".to_owned(),
                    arguments: json!({ "command": "ls" }),
                }),
            ],
        };
        let text = serde_json::to_string(&message).expect("serialises");
        assert_eq!(
            serde_json::from_str::<Message>(&text).expect("parses"),
            message
        );
    }
}
