//! The store's own view: its models with their prices, and the record of each call.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Prices of a model in credits per million tokens (decimal strings).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenPrices {
    pub input: String,
    pub cached_input: String,
    pub cache_write: String,
    pub output: String,
}

/// A model teams may call through the store.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StoreModel {
    /// The id to send as `model`, such as `openai/gpt-4o-mini`.
    pub id: String,
    /// `openai` (call it at `/openai/v1`) or `anthropic` (at `/anthropic`).
    pub family: String,
    pub context_window: u64,
    /// Output tokens assumed (and reserved) when a request sets no maximum.
    pub max_output: u64,
    /// Credits per million tokens.
    pub prices: TokenPrices,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StoreModelList {
    pub models: Vec<StoreModel>,
}

/// Tokens of a call by kind (input is the uncached input).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct TokenCounts {
    pub input: i64,
    pub cached_input: i64,
    pub cache_write: i64,
    pub output: i64,
}

/// One call to the store, named by the `x-sandbase-store-request` header of its answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StoreRequest {
    pub id: Uuid,
    /// `model` (an API call is `api`).
    pub kind: String,
    /// The model's id.
    pub name: String,
    /// The provider's route, such as `chat/completions` or `messages`.
    pub endpoint: String,
    pub streamed: bool,
    /// The provider's status.
    pub status: i32,
    pub tokens: TokenCounts,
    /// What it cost, in credits (decimal string) and micro-credits.
    pub credits: String,
    pub credits_micro: i64,
    /// No usage came back: the reservation was billed.
    pub estimated: bool,
    pub latency_ms: i64,
    pub first_byte_ms: Option<i64>,
    pub api_key_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StoreRequestList {
    pub requests: Vec<StoreRequest>,
}

/// A paid API teams may call at `/store/apis/{name}/…` with their SandBase key.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StoreApi {
    pub name: String,
    /// Credits per call (decimal string).
    pub price_per_call: String,
    /// Credits per MiB of answer (decimal string).
    pub price_per_mib: String,
    /// The largest answer passed on, in bytes.
    pub max_response_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StoreApiList {
    pub apis: Vec<StoreApi>,
}
