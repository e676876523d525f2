//! Anthropic-shaped Messages calls answered by an OpenAI model (Claude Code and the Anthropic
//! SDKs pointed at the store, calling `openai/…`): the request turned into a chat completions
//! request, the answer (and its errors) turned back into a message. Prompt caching marks are
//! dropped (OpenAI caches on its own) and so is extended thinking, which has no counterpart
//! in chat completions; documents and server tools are refused by name. Streams are
//! translated by `messages_stream`.

use sandbase_api::conversation::ToolCall;
use serde_json::{Value, json};

/// The chat completions request for a Messages request `messages`, to the provider's model
/// `upstream`, asking a stream for its usage (the gateway meters from it).
pub fn messages_to_chat(messages: &Value, upstream: &str) -> Result<Value, String> {
    let mut chat: Vec<Value> = Vec::new();
    match messages.get("system") {
        None | Some(Value::Null) => {}
        Some(system) => chat.push(json!({ "role": "system", "content": blocks_text(system)? })),
    }
    let turns = messages
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("`messages` must be an array")?;
    for (index, turn) in turns.iter().enumerate() {
        let at = |why: String| format!("messages[{index}]: {why}");
        match turn.get("role").and_then(Value::as_str) {
            Some("user") => user_turn(&turn["content"], &mut chat).map_err(at)?,
            Some("assistant") => chat.push(assistant_turn(&turn["content"]).map_err(at)?),
            other => {
                return Err(at(format!(
                    "the role `{}` is not known",
                    other.unwrap_or("?")
                )));
            }
        }
    }
    let mut request = json!({ "model": upstream, "messages": chat });
    if let Some(max) = messages.get("max_tokens").and_then(Value::as_u64) {
        request["max_completion_tokens"] = json!(max);
    }
    for field in ["temperature", "top_p"] {
        if let Some(value) = messages.get(field).and_then(Value::as_f64) {
            request[field] = json!(value);
        }
    }
    if let Some(stops) = messages.get("stop_sequences").and_then(Value::as_array) {
        request["stop"] = Value::Array(stops.clone());
    }
    if let Some(user) = messages
        .pointer("/metadata/user_id")
        .and_then(Value::as_str)
    {
        request["user"] = json!(user);
    }
    if messages.get("stream").and_then(Value::as_bool) == Some(true) {
        request["stream"] = Value::Bool(true);
        request["stream_options"] = json!({ "include_usage": true });
    }
    tools(messages, &mut request)?;
    Ok(request)
}

/// A `system` or a content that must be text: a string, or text blocks.
fn blocks_text(content: &Value) -> Result<String, String> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .map(|block| match block.get("type").and_then(Value::as_str) {
                Some("text") => Ok(block["text"].as_str().unwrap_or_default().to_owned()),
                other => Err(format!(
                    "a `{}` block where text was expected",
                    other.unwrap_or("?")
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.join("\n\n")),
        _ => Err("must be a string or an array of blocks".to_owned()),
    }
}

/// A user turn: its tool results as `tool` messages (first, as OpenAI wants them right
/// after the assistant's calls), the rest as one user message.
fn user_turn(content: &Value, chat: &mut Vec<Value>) -> Result<(), String> {
    let Value::Array(blocks) = content else {
        chat.push(json!({ "role": "user", "content": blocks_text(content)? }));
        return Ok(());
    };
    let mut parts = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("tool_result") => {
                let text = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(content) => blocks_text(content)?,
                };
                let text = if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                    format!("Error: {text}")
                } else {
                    text
                };
                chat.push(json!({ "role": "tool", "tool_call_id": block["tool_use_id"], "content": text }));
            }
            Some("text") => parts.push(json!({ "type": "text", "text": block["text"] })),
            Some("image") => parts.push(image_part(&block["source"])?),
            other => {
                return Err(format!(
                    "`{}` blocks are not offered for OpenAI models",
                    other.unwrap_or("?")
                ));
            }
        }
    }
    if !parts.is_empty() {
        chat.push(json!({ "role": "user", "content": parts }));
    }
    Ok(())
}

fn image_part(source: &Value) -> Result<Value, String> {
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => format!(
            "data:{};base64,{}",
            source["media_type"].as_str().unwrap_or("image/png"),
            source["data"].as_str().unwrap_or_default()
        ),
        Some("url") => source["url"].as_str().unwrap_or_default().to_owned(),
        _ => return Err("an image's source must be base64 or a URL".to_owned()),
    };
    Ok(json!({ "type": "image_url", "image_url": { "url": url } }))
}

fn assistant_turn(content: &Value) -> Result<Value, String> {
    let Value::Array(blocks) = content else {
        return Ok(json!({ "role": "assistant", "content": blocks_text(content)? }));
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => calls.push(ToolCall::from_tool_use(block).to_chat()),
            // The model's own thinking is not sent back to another family's model.
            Some("thinking" | "redacted_thinking") => {}
            other => {
                return Err(format!(
                    "`{}` blocks are not offered for OpenAI models",
                    other.unwrap_or("?")
                ));
            }
        }
    }
    let mut turn = json!({ "role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text) } });
    if !calls.is_empty() {
        turn["tool_calls"] = Value::Array(calls);
    }
    Ok(turn)
}

/// `tools` and `tool_choice`, in OpenAI's terms.
fn tools(messages: &Value, request: &mut Value) -> Result<(), String> {
    if let Some(listed) = messages.get("tools").and_then(Value::as_array) {
        let tools = listed
            .iter()
            .map(|tool| {
                if tool.get("input_schema").is_none() {
                    return Err(format!(
                        "the server tool `{}` is not offered for OpenAI models",
                        tool["name"].as_str().unwrap_or("?")
                    ));
                }
                let mut function =
                    json!({ "name": tool["name"], "parameters": tool["input_schema"] });
                if let Some(description) = tool.get("description") {
                    function["description"] = description.clone();
                }
                Ok(json!({ "type": "function", "function": function }))
            })
            .collect::<Result<Vec<_>, String>>()?;
        request["tools"] = Value::Array(tools);
    }
    if let Some(choice) = messages.get("tool_choice") {
        request["tool_choice"] = match choice["type"].as_str() {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({ "type": "function", "function": { "name": choice["name"] } }),
            other => {
                return Err(format!(
                    "`tool_choice` `{}` is not known",
                    other.unwrap_or("?")
                ));
            }
        };
        if choice
            .get("disable_parallel_tool_use")
            .and_then(Value::as_bool)
            == Some(true)
        {
            request["parallel_tool_calls"] = Value::Bool(false);
        }
    }
    Ok(())
}

/// Why the model stopped, in Anthropic's words.
pub fn stop_reason(finish_reason: Option<&str>) -> &'static str {
    match finish_reason {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

/// An OpenAI chat `usage` as Anthropic's (cached prompt tokens are cache reads there, beside
/// the uncached input).
pub fn usage(usage: &Value) -> Value {
    let count = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
    let cached = count("/prompt_tokens_details/cached_tokens");
    json!({
        "input_tokens": count("/prompt_tokens").saturating_sub(cached),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": count("/completion_tokens"),
    })
}

/// A chat completion as a message of the public model `model`.
pub fn chat_to_message(chat: &Value, model: &str) -> Value {
    let choice = &chat["choices"][0];
    let mut content = Vec::new();
    if let Some(text) = choice.pointer("/message/content").and_then(Value::as_str)
        && !text.is_empty()
    {
        content.push(json!({ "type": "text", "text": text }));
    }
    for call in choice
        .pointer("/message/tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        content.push(ToolCall::from_chat_answer(call).to_tool_use());
    }
    json!({
        "id": format!("msg_{}", chat["id"].as_str().unwrap_or_default()),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice["finish_reason"].as_str()),
        "stop_sequence": Value::Null,
        "usage": usage(&chat["usage"]),
    })
}

/// Anthropic's error type for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 402 | 409 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 | 503 => "overloaded_error",
        _ => "api_error",
    }
}

/// An OpenAI error body as Anthropic's.
pub fn error_to_message(status: u16, body: &[u8]) -> Vec<u8> {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let message = parsed
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or("the provider refused the call");
    json!({ "type": "error", "error": { "type": error_type(status), "message": message } })
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_come_first_as_tool_messages_and_caching_marks_are_dropped() {
        let messages = json!({
            "model": "openai/gpt", "max_tokens": 50, "stream": true,
            "system": [{ "type": "text", "text": "A", "cache_control": { "type": "ephemeral" } }, { "type": "text", "text": "B" }],
            "thinking": { "type": "enabled", "budget_tokens": 1024 },
            "messages": [
                { "role": "user", "content": [{ "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBOR" } }] },
                { "role": "assistant", "content": [
                    { "type": "thinking", "thinking": "hm", "signature": "s" },
                    { "type": "tool_use", "id": "t1", "name": "a", "input": { "x": 1 } },
                ]},
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "t1", "content": [{ "type": "text", "text": "no" }], "is_error": true },
                    { "type": "text", "text": "then?" },
                ]},
            ],
            "tool_choice": { "type": "tool", "name": "a", "disable_parallel_tool_use": true },
        });
        let chat = messages_to_chat(&messages, "gpt-x").unwrap();
        assert_eq!(chat["model"], "gpt-x");
        assert_eq!(chat["max_completion_tokens"], 50);
        assert_eq!(chat["stream_options"], json!({ "include_usage": true }));
        assert!(chat.get("thinking").is_none());
        let turns = chat["messages"].as_array().unwrap();
        let roles: Vec<&str> = turns
            .iter()
            .map(|turn| turn["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(turns[0]["content"], "A\n\nB");
        assert_eq!(
            turns[1]["content"][0]["image_url"]["url"],
            "data:image/png;base64,iVBOR"
        );
        assert_eq!(turns[2]["content"], Value::Null);
        assert_eq!(
            turns[2]["tool_calls"][0]["function"]["arguments"],
            "{\"x\":1}"
        );
        assert_eq!(
            turns[3],
            json!({ "role": "tool", "tool_call_id": "t1", "content": "Error: no" })
        );
        assert_eq!(
            chat["tool_choice"],
            json!({ "type": "function", "function": { "name": "a" } })
        );
        assert_eq!(chat["parallel_tool_calls"], false);
    }

    #[test]
    fn documents_and_server_tools_are_refused_by_name() {
        let document =
            json!({ "messages": [{ "role": "user", "content": [{ "type": "document" }] }] });
        assert!(
            messages_to_chat(&document, "m")
                .unwrap_err()
                .contains("`document`")
        );
        let server_tool = json!({ "messages": [], "tools": [{ "type": "web_search_20250305", "name": "web_search" }] });
        assert!(
            messages_to_chat(&server_tool, "m")
                .unwrap_err()
                .contains("web_search")
        );
    }
}
