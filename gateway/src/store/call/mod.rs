//! A model call of the store, for any caller (the provider-shaped HTTP routes, the harness),
//! in named phases: the caller (authenticated before it gets here) → admission (the model
//! found, of the endpoint's family or the other one through translation; the worst case
//! reserved) → the upstream request (the operator's credential) → the answer (whole, or a
//! stream passed through the usage tap and the translation) → settlement (the real usage
//! debited; a client that went away is billed for what the upstream sent, read to its end
//! for at most `store.drain_secs`). It answers bytes, never an HTTP framework's types.

mod admit;
mod answer;
mod vet;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use http::HeaderValue;
use serde_json::Value;
use uuid::Uuid;

use super::Family;
use super::usage::Shape;
use crate::error::ApiError;
use crate::state::AppState;

/// One of the store's model endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// OpenAI's `chat/completions`.
    Chat,
    /// OpenAI's `responses`.
    Responses,
    /// OpenAI's `embeddings`.
    Embeddings,
    /// Anthropic's `messages`.
    Messages,
}

impl Endpoint {
    pub fn family(self) -> Family {
        match self {
            Endpoint::Chat | Endpoint::Responses | Endpoint::Embeddings => Family::Openai,
            Endpoint::Messages => Family::Anthropic,
        }
    }

    /// Its path under the provider's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat/completions",
            Endpoint::Responses => "responses",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Messages => "messages",
        }
    }

    /// How its answers report usage.
    fn shape(self) -> Shape {
        match self {
            Endpoint::Chat => Shape::OpenaiChat,
            Endpoint::Responses => Shape::OpenaiResponses,
            Endpoint::Embeddings => Shape::OpenaiEmbeddings,
            Endpoint::Messages => Shape::Anthropic,
        }
    }

    /// Where a request sets its output maximum, in order of preference (none: the answer
    /// has no output to pay for).
    fn max_output(self) -> &'static [&'static str] {
        match self {
            Endpoint::Chat => &["max_completion_tokens", "max_tokens"],
            Endpoint::Responses => &["max_output_tokens"],
            Endpoint::Embeddings => &[],
            Endpoint::Messages => &["max_tokens"],
        }
    }
}

/// The client's headers a family passes on to its provider (Anthropic's version and betas).
#[derive(Debug, Clone, Default)]
pub struct ClientHeaders {
    pub anthropic_version: Option<String>,
    pub anthropic_beta: Option<String>,
}

impl ClientHeaders {
    /// The headers sent to a provider of `family`.
    fn for_family(&self, family: Family) -> Vec<(&'static str, String)> {
        match family {
            Family::Openai => Vec::new(),
            Family::Anthropic => {
                let version = self
                    .anthropic_version
                    .clone()
                    .unwrap_or_else(|| super::ANTHROPIC_VERSION.to_owned());
                let mut headers = vec![("anthropic-version", version)];
                if let Some(beta) = &self.anthropic_beta {
                    headers.push(("anthropic-beta", beta.clone()));
                }
                headers
            }
        }
    }
}

/// A model call as a caller asks for it: the endpoint, the request body as the client sent
/// it (JSON), and the client's headers a provider takes.
pub struct ModelCall {
    pub endpoint: Endpoint,
    pub body: Bytes,
    pub headers: ClientHeaders,
}

/// What the store answers a model call.
pub enum Answer {
    Whole(Whole),
    Stream(Streamed),
}

/// A whole answer: the provider's status, content type and body (translated when the call
/// was), and the store's record of the call when it was admitted.
pub struct Whole {
    pub status: u16,
    pub content_type: Option<HeaderValue>,
    /// A refusal's `Retry-After`, passed on.
    pub retry_after: Option<HeaderValue>,
    pub body: Bytes,
    pub request_id: Option<Uuid>,
}

/// A streamed answer: its chunks as they come (tapped for usage and translated), settled
/// when it ends.
pub struct Streamed {
    pub status: u16,
    pub content_type: Option<HeaderValue>,
    pub request_id: Uuid,
    pub body: BoxStream<'static, Result<Bytes, std::io::Error>>,
}

/// Calls a model for `caller`: admitted (or refused) here; the upstream call runs in a task
/// of its own, so a caller that goes away does not stop its metering.
pub async fn call(
    state: &AppState,
    caller: &super::Caller,
    request: ModelCall,
) -> Result<Answer, ApiError> {
    let admitted = admit::admit(state, caller, &request).await?;
    let handle = tokio::spawn(answer::answer(state.clone(), admitted));
    handle
        .await
        .map_err(|_| ApiError::Internal(anyhow::anyhow!("a store call failed")))?
}

/// Counts a messages request's tokens (free: forwarded for an authenticated caller, not
/// metered).
pub async fn count_tokens(
    state: &AppState,
    caller: &super::Caller,
    body: &Bytes,
    headers: &ClientHeaders,
) -> Result<Answer, ApiError> {
    let family = Family::Anthropic;
    let (mut json, model_id) = admit::parse(body)?;
    let (model, provider) = state
        .store
        .model(family.name(), &model_id)
        .ok_or_else(|| ApiError::ModelNotFound(model_id.clone()))?;
    // Free, but only for a model the caller's key may call.
    super::allowed::lineage_allowing(state, caller.principal.api_key_id(), &model.settings.id)
        .await?;
    json["model"] = Value::String(model.settings.upstream.clone());
    let request = provider.post(
        "messages/count_tokens",
        json.to_string().into_bytes(),
        &headers.for_family(family),
    );
    let answer = request.send().await.map_err(answer::upstream_error)?;
    let status = answer.status();
    if matches!(status.as_u16(), 401 | 403) {
        return Err(ApiError::UpstreamAuthFailed);
    }
    let content_type = answer.headers().get(http::header::CONTENT_TYPE).cloned();
    let body = answer.bytes().await.map_err(answer::upstream_error)?;
    Ok(Answer::Whole(Whole {
        status: status.as_u16(),
        content_type,
        retry_after: None,
        body,
        request_id: None,
    }))
}
