//! Token usage as each family reports it, normalised to four kinds, and priced.
//!
//! OpenAI counts cached tokens inside `prompt_tokens` / `input_tokens`; Anthropic counts
//! cache reads and writes outside `input_tokens`. Normalised, `input` is always the uncached
//! input, so each token is priced once.

use serde_json::Value;

use crate::config::TokenPrices;

/// Tokens of one call by kind: the conversation's own usage form.
pub use sandbase_api::conversation::Usage as TokenUsage;

/// Micro-credits of `usage`, rounded up once over the whole call (prices are per million
/// tokens).
pub fn cost(usage: &TokenUsage, prices: &TokenPrices) -> i64 {
    let part = |tokens: u64, price: i64| u128::from(tokens) * price.max(0) as u128;
    let total = part(usage.input_tokens, prices.input)
        + part(usage.cached_input_tokens, prices.cached_input)
        + part(usage.cache_write_tokens, prices.cache_write)
        + part(usage.output_tokens, prices.output);
    i64::try_from(total.div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

fn count(value: &Value, pointer: &str) -> u64 {
    value.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

/// An OpenAI `usage` object (chat completions, embeddings): `prompt_tokens` (cached ones
/// inside), `completion_tokens`.
pub fn openai_chat(usage: &Value) -> Option<TokenUsage> {
    let prompt = usage.get("prompt_tokens")?.as_u64()?;
    let cached = count(usage, "/prompt_tokens_details/cached_tokens").min(prompt);
    Some(TokenUsage {
        input_tokens: prompt - cached,
        cached_input_tokens: cached,
        cache_write_tokens: 0,
        output_tokens: count(usage, "/completion_tokens"),
    })
}

/// An OpenAI Responses `usage` object: `input_tokens` (cached ones inside), `output_tokens`.
pub fn openai_responses(usage: &Value) -> Option<TokenUsage> {
    let input = usage.get("input_tokens")?.as_u64()?;
    let cached = count(usage, "/input_tokens_details/cached_tokens").min(input);
    Some(TokenUsage {
        input_tokens: input - cached,
        cached_input_tokens: cached,
        cache_write_tokens: 0,
        output_tokens: count(usage, "/output_tokens"),
    })
}

/// An Anthropic `usage` object: `input_tokens` (uncached), cache reads and writes beside it.
pub fn anthropic(usage: &Value) -> Option<TokenUsage> {
    usage.as_object()?;
    Some(TokenUsage {
        input_tokens: count(usage, "/input_tokens"),
        cached_input_tokens: count(usage, "/cache_read_input_tokens"),
        cache_write_tokens: count(usage, "/cache_creation_input_tokens"),
        output_tokens: count(usage, "/output_tokens"),
    })
}

/// Which response shape a call's usage comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenaiChat,
    OpenaiResponses,
    OpenaiEmbeddings,
    Anthropic,
}

/// The usage of a whole (non-streamed) response body.
pub fn from_body(shape: Shape, body: &Value) -> Option<TokenUsage> {
    let usage = body.get("usage")?;
    match shape {
        Shape::OpenaiChat | Shape::OpenaiEmbeddings => openai_chat(usage),
        Shape::OpenaiResponses => openai_responses(usage),
        Shape::Anthropic => anthropic(usage),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_family_is_normalised_and_priced_once() {
        let chat = openai_chat(&json!({
            "prompt_tokens": 1000, "completion_tokens": 20,
            "prompt_tokens_details": { "cached_tokens": 800 }
        }))
        .unwrap();
        assert_eq!(
            (
                chat.input_tokens,
                chat.cached_input_tokens,
                chat.output_tokens
            ),
            (200, 800, 20)
        );
        let claude = anthropic(&json!({
            "input_tokens": 5, "cache_read_input_tokens": 700,
            "cache_creation_input_tokens": 300, "output_tokens": 9
        }))
        .unwrap();
        assert_eq!(
            (
                claude.input_tokens,
                claude.cached_input_tokens,
                claude.cache_write_tokens
            ),
            (5, 700, 300)
        );
        let prices = TokenPrices {
            input: 3_000_000,
            cached_input: 300_000,
            cache_write: 3_750_000,
            output: 15_000_000,
        };
        // 5×3 + 700×0.3 + 300×3.75 + 9×15 = 15 + 210 + 1125 + 135 micro.
        assert_eq!(cost(&claude, &prices), 1485);
        // Rounded up once, over the whole call.
        let one = TokenUsage {
            input_tokens: 1,
            ..TokenUsage::default()
        };
        let cheap = TokenPrices {
            input: 150_000,
            ..TokenPrices::default()
        };
        assert_eq!(cost(&one, &cheap), 1);
    }
}
