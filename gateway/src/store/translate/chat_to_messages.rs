//! OpenAI-shaped chat completions answered by an Anthropic model: the request turned into a
//! Messages request, the answer (and its errors) turned back into a chat completion. What
//! has no counterpart is refused with a message saying so (`n` above 1, log probabilities,
//! structured output, audio and file parts); sampling settings without one are dropped.
//! Streams are translated by `chat_stream`.

use sandbase_api::conversation::ToolCall;
use serde_json::{Map, Value, json};

/// The Messages request for a chat completions request `chat`, to the provider's model
/// `upstream`; `default_max` (the model's `max_output`) when the request sets no maximum.
pub fn chat_to_messages(chat: &Value, upstream: &str, default_max: u64) -> Result<Value, String> {
    refuse_unsupported(chat)?;
    let mut system = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    let listed = chat
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("`messages` must be an array")?;
    for (index, message) in listed.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        let at = |why: String| format!("messages[{index}]: {why}");
        match role {
            "system" | "developer" => system.push(text_of(message.get("content")).map_err(at)?),
            "user" => push(&mut messages, "user", user_blocks(message).map_err(at)?),
            "assistant" => push(
                &mut messages,
                "assistant",
                assistant_blocks(message).map_err(at)?,
            ),
            "tool" => push(
                &mut messages,
                "user",
                vec![tool_result(message).map_err(at)?],
            ),
            other => {
                return Err(at(format!(
                    "the role `{other}` is not offered for Anthropic models"
                )));
            }
        }
    }
    let max_tokens = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|field| chat.get(*field).and_then(Value::as_u64))
        .unwrap_or(default_max);
    let mut request = json!({ "model": upstream, "max_tokens": max_tokens, "messages": messages });
    if !system.is_empty() {
        request["system"] = Value::String(system.join("\n\n"));
    }
    if let Some(temperature) = chat.get("temperature").and_then(Value::as_f64) {
        // OpenAI's range is 0 to 2, Anthropic's 0 to 1.
        request["temperature"] = json!(temperature.clamp(0.0, 1.0));
    }
    if let Some(top_p) = chat.get("top_p").and_then(Value::as_f64) {
        request["top_p"] = json!(top_p);
    }
    match chat.get("stop") {
        Some(Value::String(stop)) => request["stop_sequences"] = json!([stop]),
        Some(Value::Array(stops)) => request["stop_sequences"] = Value::Array(stops.clone()),
        _ => {}
    }
    if chat.get("stream").and_then(Value::as_bool) == Some(true) {
        request["stream"] = Value::Bool(true);
    }
    if let Some(user) = chat.get("user").and_then(Value::as_str) {
        request["metadata"] = json!({ "user_id": user });
    }
    tools(chat, &mut request)?;
    Ok(request)
}

fn refuse_unsupported(chat: &Value) -> Result<(), String> {
    if chat.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err("`n` above 1 is not offered for Anthropic models".to_owned());
    }
    if chat.get("logprobs").and_then(Value::as_bool) == Some(true) {
        return Err("`logprobs` is not offered for Anthropic models".to_owned());
    }
    if let Some(kind) = chat
        .pointer("/response_format/type")
        .and_then(Value::as_str)
        && kind != "text"
    {
        return Err(format!(
            "`response_format` `{kind}` is not offered for Anthropic models (use a tool with a schema)"
        ));
    }
    if chat.get("audio").is_some_and(|audio| !audio.is_null()) {
        return Err("audio output is not offered for Anthropic models".to_owned());
    }
    Ok(())
}

/// Appends `blocks` as a turn of `role`, joined to the last turn when it has the same role
/// (tool results after tool results, a user's text after them).
fn push(messages: &mut Vec<Value>, role: &str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    if let Some(last) = messages.last_mut()
        && last["role"] == role
        && let Some(content) = last["content"].as_array_mut()
    {
        content.extend(blocks);
        return;
    }
    messages.push(json!({ "role": role, "content": blocks }));
}

/// A content that must be text: a string, or text parts.
fn text_of(content: Option<&Value>) -> Result<String, String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|part| match part.get("type").and_then(Value::as_str) {
                Some("text") => Ok(part["text"].as_str().unwrap_or_default().to_owned()),
                other => Err(format!(
                    "a `{}` part where text was expected",
                    other.unwrap_or("?")
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.join("")),
        Some(_) => Err("`content` must be a string or an array of parts".to_owned()),
    }
}

fn user_blocks(message: &Value) -> Result<Vec<Value>, String> {
    let Some(Value::Array(parts)) = message.get("content") else {
        let text = text_of(message.get("content"))?;
        return Ok(vec![json!({ "type": "text", "text": text })]);
    };
    parts
        .iter()
        .map(|part| match part.get("type").and_then(Value::as_str) {
            Some("text") => {
                Ok(json!({ "type": "text", "text": part["text"].as_str().unwrap_or_default() }))
            }
            Some("image_url") => {
                let url = part
                    .pointer("/image_url/url")
                    .and_then(Value::as_str)
                    .ok_or("an `image_url` part without a URL")?;
                Ok(json!({ "type": "image", "source": image_source(url)? }))
            }
            other => Err(format!(
                "`{}` parts are not offered for Anthropic models",
                other.unwrap_or("?")
            )),
        })
        .collect()
}

/// A `data:` URL as base64 data, any other URL as a URL.
fn image_source(url: &str) -> Result<Value, String> {
    let Some(rest) = url.strip_prefix("data:") else {
        return Ok(json!({ "type": "url", "url": url }));
    };
    let (media_type, data) = rest
        .split_once(";base64,")
        .ok_or("an image `data:` URL must be base64")?;
    Ok(json!({ "type": "base64", "media_type": media_type, "data": data }))
}

fn assistant_blocks(message: &Value) -> Result<Vec<Value>, String> {
    let mut blocks = Vec::new();
    let text = text_of(message.get("content"))?;
    if !text.is_empty() {
        blocks.push(json!({ "type": "text", "text": text }));
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        blocks.push(ToolCall::from_chat(call)?.to_tool_use());
    }
    Ok(blocks)
}

fn tool_result(message: &Value) -> Result<Value, String> {
    let id = message
        .get("tool_call_id")
        .and_then(Value::as_str)
        .ok_or("a `tool` message without `tool_call_id`")?;
    Ok(json!({
        "type": "tool_result",
        "tool_use_id": id,
        "content": text_of(message.get("content"))?,
    }))
}

/// `tools`, `tool_choice` and `parallel_tool_calls`, in Anthropic's terms.
fn tools(chat: &Value, request: &mut Value) -> Result<(), String> {
    if let Some(listed) = chat.get("tools").and_then(Value::as_array) {
        let tools = listed
            .iter()
            .map(|tool| {
                if tool.get("type").and_then(Value::as_str) != Some("function") {
                    return Err("only `function` tools are offered for Anthropic models".to_owned());
                }
                let function = &tool["function"];
                let mut out = Map::new();
                out.insert("name".to_owned(), function["name"].clone());
                if let Some(description) = function.get("description") {
                    out.insert("description".to_owned(), description.clone());
                }
                let schema = function
                    .get("parameters")
                    .cloned()
                    .unwrap_or_else(|| json!({ "type": "object", "properties": {} }));
                out.insert("input_schema".to_owned(), schema);
                Ok(Value::Object(out))
            })
            .collect::<Result<Vec<_>, String>>()?;
        request["tools"] = Value::Array(tools);
    }
    let mut choice = match chat.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(mode)) => Some(match mode.as_str() {
            "auto" => json!({ "type": "auto" }),
            "none" => json!({ "type": "none" }),
            "required" => json!({ "type": "any" }),
            other => return Err(format!("`tool_choice` `{other}` is not known")),
        }),
        Some(named) => Some(json!({
            "type": "tool",
            "name": named.pointer("/function/name").cloned().unwrap_or(Value::Null),
        })),
    };
    if chat.get("parallel_tool_calls").and_then(Value::as_bool) == Some(false) {
        let choice = choice.get_or_insert_with(|| json!({ "type": "auto" }));
        choice["disable_parallel_tool_use"] = Value::Bool(true);
    }
    if let Some(choice) = choice {
        request["tool_choice"] = choice;
    }
    Ok(())
}

/// Why the model stopped, in OpenAI's words.
pub fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        _ => "stop",
    }
}

/// An Anthropic `usage` as OpenAI's (cache reads and writes are prompt tokens there).
pub fn usage(usage: &Value) -> Value {
    let count = |field: &str| usage.get(field).and_then(Value::as_u64).unwrap_or(0);
    let cached = count("cache_read_input_tokens");
    let prompt = count("input_tokens") + cached + count("cache_creation_input_tokens");
    let completion = count("output_tokens");
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": cached },
    })
}

/// An Anthropic message as a chat completion of the public model `model`.
pub fn message_to_chat(message: &Value, model: &str) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in message["content"].as_array().into_iter().flatten() {
        match block["type"].as_str() {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => calls.push(ToolCall::from_tool_use(block).to_chat()),
            _ => {}
        }
    }
    let mut reply = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) },
        "refusal": Value::Null,
    });
    if !calls.is_empty() {
        reply["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": format!("chatcmpl-{}", message["id"].as_str().unwrap_or_default()),
        "object": "chat.completion",
        "created": chrono::Utc::now().timestamp(),
        "model": model,
        "choices": [{
            "index": 0,
            "message": reply,
            "finish_reason": finish_reason(message["stop_reason"].as_str()),
            "logprobs": Value::Null,
        }],
        "usage": usage(&message["usage"]),
    })
}

/// An Anthropic error body as OpenAI's.
pub fn error_to_chat(body: &[u8]) -> Vec<u8> {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let error = &parsed["error"];
    json!({
        "error": {
            "message": error["message"].as_str().unwrap_or("the provider refused the call"),
            "type": error["type"].as_str().unwrap_or("api_error"),
            "param": Value::Null,
            "code": Value::Null,
        }
    })
    .to_string()
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_images_and_parallel_tool_results_becomes_alternating_turns() {
        let chat = json!({
            "model": "anthropic/claude",
            "max_completion_tokens": 300,
            "messages": [
                { "role": "developer", "content": [{ "type": "text", "text": "Terse." }] },
                { "role": "user", "content": [
                    { "type": "text", "text": "What is this?" },
                    { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBOR" } },
                    { "type": "image_url", "image_url": { "url": "https://example.com/a.jpg" } },
                ]},
                { "role": "assistant", "content": null, "tool_calls": [
                    { "id": "t1", "type": "function", "function": { "name": "a", "arguments": "{\"x\":1}" } },
                    { "id": "t2", "type": "function", "function": { "name": "b", "arguments": "" } },
                ]},
                { "role": "tool", "tool_call_id": "t1", "content": "one" },
                { "role": "tool", "tool_call_id": "t2", "content": [{ "type": "text", "text": "two" }] },
                { "role": "user", "content": "and?" },
            ],
        });
        let sent = chat_to_messages(&chat, "claude-x", 4096).unwrap();
        assert_eq!(sent["model"], "claude-x");
        assert_eq!(sent["max_tokens"], 300);
        assert_eq!(sent["system"], "Terse.");
        let turns = sent["messages"].as_array().unwrap();
        let roles: Vec<&str> = turns
            .iter()
            .map(|turn| turn["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert_eq!(
            turns[0]["content"][1]["source"],
            json!({ "type": "base64", "media_type": "image/png", "data": "iVBOR" })
        );
        assert_eq!(turns[0]["content"][2]["source"]["type"], "url");
        assert_eq!(turns[1]["content"][0]["input"], json!({ "x": 1 }));
        assert_eq!(turns[1]["content"][1]["input"], json!({}));
        // Both results, then the user's next words, in one user turn.
        let last: Vec<&str> = turns[2]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|block| block["type"].as_str().unwrap())
            .collect();
        assert_eq!(last, ["tool_result", "tool_result", "text"]);
        assert_eq!(turns[2]["content"][1]["content"], "two");
    }

    #[test]
    fn what_has_no_counterpart_is_refused_by_name() {
        let refused = |extra: Value| {
            let mut chat = json!({ "messages": [{ "role": "user", "content": "hi" }] });
            chat.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            chat_to_messages(&chat, "m", 10).unwrap_err()
        };
        assert!(refused(json!({ "n": 3 })).contains("`n`"));
        assert!(refused(json!({ "logprobs": true })).contains("logprobs"));
        assert!(
            refused(json!({ "response_format": { "type": "json_schema" } }))
                .contains("json_schema")
        );
        assert!(refused(json!({ "tools": [{ "type": "custom" }] })).contains("function"));
        let mut chat = json!({ "messages": [{ "role": "function", "content": "x" }] });
        assert!(
            chat_to_messages(&chat, "m", 10)
                .unwrap_err()
                .contains("messages[0]")
        );
        chat["messages"] = json!([{ "role": "user", "content": [{ "type": "input_audio" }] }]);
        assert!(
            chat_to_messages(&chat, "m", 10)
                .unwrap_err()
                .contains("input_audio")
        );
    }

    #[test]
    fn an_answer_with_text_and_a_tool_use_becomes_one_choice() {
        let message = json!({
            "id": "msg_9", "stop_reason": "tool_use",
            "content": [{ "type": "text", "text": "Let me see." }, { "type": "tool_use", "id": "t1", "name": "a", "input": { "x": 1 } }],
            "usage": { "input_tokens": 5, "cache_creation_input_tokens": 2, "cache_read_input_tokens": 3, "output_tokens": 4 },
        });
        let chat = message_to_chat(&message, "anthropic/claude");
        assert_eq!(chat["id"], "chatcmpl-msg_9");
        assert_eq!(chat["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(chat["choices"][0]["message"]["content"], "Let me see.");
        assert_eq!(
            chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"x\":1}"
        );
        assert_eq!(
            chat["usage"],
            json!({ "prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14, "prompt_tokens_details": { "cached_tokens": 3 } })
        );
    }
}
