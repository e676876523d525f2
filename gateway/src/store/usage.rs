//! Token usage as each family reports it, normalised to four kinds, and priced.
//!
//! OpenAI counts cached tokens inside `prompt_tokens` / `input_tokens`; Anthropic counts
//! cache reads and writes outside `input_tokens`. Normalised, `input` is always the uncached
//! input, so each token is priced once.

use serde_json::Value;

use crate::config::TokenPrices;

/// Tokens of one call by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenUsage {
    pub input: u64,
    pub cached_input: u64,
    pub cache_write: u64,
    pub output: u64,
}

impl TokenUsage {
    /// Micro-credits, rounded up once over the whole call (prices are per million tokens).
    pub fn cost(&self, prices: &TokenPrices) -> i64 {
        let part = |tokens: u64, price: i64| u128::from(tokens) * price.max(0) as u128;
        let total = part(self.input, prices.input)
            + part(self.cached_input, prices.cached_input)
            + part(self.cache_write, prices.cache_write)
            + part(self.output, prices.output);
        i64::try_from(total.div_ceil(1_000_000)).unwrap_or(i64::MAX)
    }
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
        input: prompt - cached,
        cached_input: cached,
        cache_write: 0,
        output: count(usage, "/completion_tokens"),
    })
}

/// An OpenAI Responses `usage` object: `input_tokens` (cached ones inside), `output_tokens`.
pub fn openai_responses(usage: &Value) -> Option<TokenUsage> {
    let input = usage.get("input_tokens")?.as_u64()?;
    let cached = count(usage, "/input_tokens_details/cached_tokens").min(input);
    Some(TokenUsage {
        input: input - cached,
        cached_input: cached,
        cache_write: 0,
        output: count(usage, "/output_tokens"),
    })
}

/// An Anthropic `usage` object: `input_tokens` (uncached), cache reads and writes beside it.
pub fn anthropic(usage: &Value) -> Option<TokenUsage> {
    usage.as_object()?;
    Some(TokenUsage {
        input: count(usage, "/input_tokens"),
        cached_input: count(usage, "/cache_read_input_tokens"),
        cache_write: count(usage, "/cache_creation_input_tokens"),
        output: count(usage, "/output_tokens"),
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
        assert_eq!((chat.input, chat.cached_input, chat.output), (200, 800, 20));
        let claude = anthropic(&json!({
            "input_tokens": 5, "cache_read_input_tokens": 700,
            "cache_creation_input_tokens": 300, "output_tokens": 9
        }))
        .unwrap();
        assert_eq!(
            (claude.input, claude.cached_input, claude.cache_write),
            (5, 700, 300)
        );
        let prices = TokenPrices {
            input: 3_000_000,
            cached_input: 300_000,
            cache_write: 3_750_000,
            output: 15_000_000,
        };
        // 5×3 + 700×0.3 + 300×3.75 + 9×15 = 15 + 210 + 1125 + 135 micro.
        assert_eq!(claude.cost(&prices), 1485);
        // Rounded up once, over the whole call.
        let one = TokenUsage {
            input: 1,
            ..TokenUsage::default()
        };
        let cheap = TokenPrices {
            input: 150_000,
            ..TokenPrices::default()
        };
        assert_eq!(one.cost(&cheap), 1);
    }
}
