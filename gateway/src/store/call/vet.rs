//! What a model call may ask of a provider, before anything is reserved: only the fields an
//! endpoint knows (the upstream request is the client's body less nothing it did not name
//! here), nothing that changes the price in a way the store does not price (a priority
//! service tier, audio, the provider's own server-side tools, a long-context beta), and how
//! much to reserve for what the body cannot show (images and files, a stored conversation).

use serde_json::Value;

use super::{ClientHeaders, Endpoint};
use crate::error::ApiError;

/// Top-level fields each endpoint passes on.
fn known(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::Chat => &[
            "model",
            "messages",
            "stream",
            "stream_options",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "n",
            "stop",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "user",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "response_format",
            "seed",
            "reasoning_effort",
            "metadata",
            "store",
            "modalities",
            "prediction",
            "safety_identifier",
            "prompt_cache_key",
            "verbosity",
            "service_tier",
            "functions",
            "function_call",
        ],
        Endpoint::Responses => &[
            "model",
            "input",
            "instructions",
            "stream",
            "stream_options",
            "max_output_tokens",
            "temperature",
            "top_p",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "text",
            "reasoning",
            "metadata",
            "store",
            "previous_response_id",
            "conversation",
            "truncation",
            "user",
            "include",
            "service_tier",
            "prompt",
            "prompt_cache_key",
            "safety_identifier",
            "max_tool_calls",
            "top_logprobs",
            "background",
        ],
        Endpoint::Embeddings => &["model", "input", "encoding_format", "dimensions", "user"],
        Endpoint::Messages => &[
            "model",
            "messages",
            "system",
            "max_tokens",
            "stream",
            "temperature",
            "top_p",
            "top_k",
            "stop_sequences",
            "tools",
            "tool_choice",
            "metadata",
            "thinking",
            "service_tier",
        ],
    }
}

/// What the vetting found that the reservation must cover.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Vetted {
    /// Tokens arrive that the body does not show (images, files, audio, a stored
    /// conversation): reserve the model's whole context window as input.
    pub full_window: bool,
    /// Completions asked for at once (`n`): the output is reserved this many times.
    pub choices: u64,
}

fn refused(message: String) -> ApiError {
    ApiError::UnsupportedParameter(message)
}

/// Checks a call's body and headers; what the reservation must cover.
pub(super) fn vet(
    endpoint: Endpoint,
    json: &Value,
    headers: &ClientHeaders,
) -> Result<Vetted, ApiError> {
    let object = json.as_object().into_iter().flatten();
    for (field, _) in object {
        if !known(endpoint).contains(&field.as_str()) {
            return Err(refused(format!(
                "`{field}` is not a parameter the store passes on for {}",
                endpoint.path()
            )));
        }
    }
    if let Some(tier) = json.get("service_tier").and_then(Value::as_str)
        && !matches!(tier, "auto" | "default" | "standard_only")
    {
        return Err(refused(format!(
            "`service_tier: {tier}` changes the provider's price, which the store does not price: leave it out or use \"auto\""
        )));
    }
    let modalities = json.get("modalities").and_then(Value::as_array);
    if json.get("audio").is_some()
        || modalities.is_some_and(|list| list.iter().any(|m| m.as_str() == Some("audio")))
    {
        return Err(refused(
            "audio output is not priced by the store".to_owned(),
        ));
    }
    server_tools(endpoint, json)?;
    if let Some(beta) = &headers.anthropic_beta
        && beta
            .split(',')
            .any(|name| name.trim().starts_with("context-1m"))
    {
        return Err(refused(
            "the long-context beta (`context-1m`) is priced differently and not by the store"
                .to_owned(),
        ));
    }
    let choices = json.get("n").and_then(Value::as_u64).unwrap_or(1);
    if !(1..=16).contains(&choices) {
        return Err(ApiError::InvalidRequest(
            "`n` must be between 1 and 16".to_owned(),
        ));
    }
    let stored = ["previous_response_id", "conversation", "prompt"]
        .iter()
        .any(|field| json.get(*field).is_some_and(|value| !value.is_null()));
    Ok(Vetted {
        full_window: stored || carries_media(json),
        choices,
    })
}

/// The provider's own tools (searched, fetched, run on its side and billed per use) are not
/// the store's to price: only tools the caller runs pass.
fn server_tools(endpoint: Endpoint, json: &Value) -> Result<(), ApiError> {
    let tools = json
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for tool in tools {
        let kind = tool.get("type").and_then(Value::as_str);
        let allowed = match endpoint {
            Endpoint::Chat => matches!(kind, Some("function" | "custom")),
            Endpoint::Responses => matches!(kind, Some("function" | "custom")),
            // A client tool has no type, or `custom`; Anthropic's computer-use, bash and text
            // editor tools are run by the client too (versioned type names).
            Endpoint::Messages => kind.is_none_or(|kind| {
                kind == "custom"
                    || ["computer_", "bash_", "text_editor_"]
                        .iter()
                        .any(|prefix| kind.starts_with(prefix))
            }),
            Endpoint::Embeddings => false,
        };
        if !allowed {
            return Err(refused(format!(
                "the provider's own tool `{}` is billed by the provider per use and not priced by the store",
                kind.unwrap_or("?")
            )));
        }
    }
    if json.get("web_search_options").is_some() || json.get("mcp_servers").is_some() {
        return Err(refused(
            "the provider's own tools are not priced by the store".to_owned(),
        ));
    }
    Ok(())
}

/// Whether any part of the body is an image, a file, audio or a document: tokens its bytes
/// do not show (an image URL is a hundred bytes and a thousand tokens).
fn carries_media(value: &Value) -> bool {
    match value {
        Value::Object(map) => {
            let media = map.get("type").and_then(Value::as_str).is_some_and(|kind| {
                matches!(
                    kind,
                    "image_url"
                        | "input_image"
                        | "image"
                        | "input_audio"
                        | "file"
                        | "input_file"
                        | "document"
                )
            });
            media || map.values().any(carries_media)
        }
        Value::Array(items) => items.iter().any(carries_media),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vetted(endpoint: Endpoint, body: Value) -> Result<Vetted, String> {
        vet(endpoint, &body, &ClientHeaders::default()).map_err(|error| error.to_string())
    }

    #[test]
    fn plain_calls_pass_and_unknown_or_unpriced_asks_are_refused() {
        let chat = json!({ "model": "m", "messages": [{ "role": "user", "content": "hi" }] });
        assert_eq!(
            vetted(Endpoint::Chat, chat.clone()),
            Ok(Vetted {
                full_window: false,
                choices: 1
            })
        );
        let mut extra = chat.clone();
        extra["surprise"] = json!(1);
        assert!(
            vetted(Endpoint::Chat, extra)
                .unwrap_err()
                .contains("`surprise`")
        );
        let mut priority = chat.clone();
        priority["service_tier"] = json!("priority");
        assert!(
            vetted(Endpoint::Chat, priority)
                .unwrap_err()
                .contains("service_tier")
        );
        let mut searching = chat.clone();
        searching["web_search_options"] = json!({});
        assert!(vetted(Endpoint::Chat, searching).is_err());
        let responses = json!({ "model": "m", "input": "hi",
            "tools": [{ "type": "web_search" }] });
        assert!(
            vetted(Endpoint::Responses, responses)
                .unwrap_err()
                .contains("web_search")
        );
        let messages = json!({ "model": "m", "max_tokens": 10, "messages": [],
            "tools": [{ "type": "web_search_20250305", "name": "web_search" },
                      { "name": "mine", "input_schema": {} }] });
        assert!(vetted(Endpoint::Messages, messages).is_err());
        let client_tools = json!({ "model": "m", "max_tokens": 10, "messages": [],
            "tools": [{ "name": "mine", "input_schema": {} },
                      { "type": "bash_20250124", "name": "bash" }] });
        assert!(vetted(Endpoint::Messages, client_tools).is_ok());
        let beta = ClientHeaders {
            anthropic_beta: Some("context-1m-2025-08-07".to_owned()),
            ..ClientHeaders::default()
        };
        let body = json!({ "model": "m", "max_tokens": 10, "messages": [] });
        assert!(vet(Endpoint::Messages, &body, &beta).is_err());
    }

    #[test]
    fn what_the_body_cannot_show_reserves_the_whole_window() {
        let image = json!({ "model": "m", "messages": [{ "role": "user", "content": [
            { "type": "image_url", "image_url": { "url": "https://example.com/a.png" } }] }] });
        assert!(vetted(Endpoint::Chat, image).unwrap().full_window);
        let continued =
            json!({ "model": "m", "input": "and then?", "previous_response_id": "resp_1" });
        assert!(vetted(Endpoint::Responses, continued).unwrap().full_window);
        let many = json!({ "model": "m", "messages": [], "n": 3 });
        assert_eq!(vetted(Endpoint::Chat, many).unwrap().choices, 3);
    }
}
