//! A model call forwarded: the caller authenticated, the model found, the worst case
//! reserved, the request sent upstream with the operator's credential, the answer passed
//! back (streams chunk by chunk through the usage tap), the real usage settled. The upstream
//! call runs in a task of its own, so a client that goes away does not stop the metering:
//! the upstream is read to its end (for at most `store.drain_secs`) and billed.

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::Value;

use super::caller::caller;
use super::errors::{Family, StoreError};
use crate::config::TokenPrices;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::meter::{self, Call, Outcome};
use crate::store::sse::Tap;
use crate::store::translation::{Translated, Translator};
use crate::store::usage::{self, Shape};

/// The header naming the store's record of the call (`GET /v1/store/requests/{id}`).
pub const REQUEST_HEADER: &str = "x-sandbase-store-request";

/// One of the forwarded endpoints.
#[derive(Clone, Copy)]
struct Endpoint {
    family: Family,
    path: &'static str,
    shape: Shape,
    /// Where a request sets its output maximum, in order of preference.
    max_output: &'static [&'static str],
}

const CHAT: Endpoint = Endpoint {
    family: Family::Openai,
    path: "chat/completions",
    shape: Shape::OpenaiChat,
    max_output: &["max_completion_tokens", "max_tokens"],
};
const RESPONSES: Endpoint = Endpoint {
    family: Family::Openai,
    path: "responses",
    shape: Shape::OpenaiResponses,
    max_output: &["max_output_tokens"],
};
const EMBEDDINGS: Endpoint = Endpoint {
    family: Family::Openai,
    path: "embeddings",
    shape: Shape::OpenaiEmbeddings,
    max_output: &[],
};
const MESSAGES: Endpoint = Endpoint {
    family: Family::Anthropic,
    path: "messages",
    shape: Shape::Anthropic,
    max_output: &["max_tokens"],
};

pub async fn openai_chat(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    forward(state, headers, body, CHAT).await
}

pub async fn openai_responses(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    forward(state, headers, body, RESPONSES).await
}

pub async fn openai_embeddings(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    forward(state, headers, body, EMBEDDINGS).await
}

pub async fn anthropic_messages(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    forward(state, headers, body, MESSAGES).await
}

/// Token counting is free: forwarded for an authenticated caller, not metered.
pub async fn anthropic_count_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let family = Family::Anthropic;
    let result = async {
        caller(&state, &headers).await?;
        let (mut json, model_id) = parse(&body)?;
        let (model, provider) = state
            .store
            .model(family.name(), &model_id)
            .ok_or_else(|| ApiError::ModelNotFound(model_id.clone()))?;
        json["model"] = Value::String(model.settings.upstream.clone());
        let request = provider.post(
            "messages/count_tokens",
            json.to_string().into_bytes(),
            &forwarded_headers(family, &headers),
        );
        let answer = request.send().await.map_err(upstream_error)?;
        let status = answer.status();
        if matches!(status.as_u16(), 401 | 403) {
            return Err(ApiError::UpstreamAuthFailed);
        }
        let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
        let bytes = answer.bytes().await.map_err(upstream_error)?;
        Ok(whole(status, content_type, bytes, None))
    }
    .await;
    result.unwrap_or_else(|error| StoreError::new(family, error).into_response())
}

/// The request as JSON and the model it names.
fn parse(body: &Bytes) -> Result<(Value, String), ApiError> {
    let json: Value = serde_json::from_slice(body)
        .map_err(|error| ApiError::InvalidJson(format!("the request body: {error}")))?;
    if !json.is_object() {
        return Err(ApiError::InvalidJson(
            "the request body must be a JSON object".to_owned(),
        ));
    }
    let model = json
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::InvalidRequest("`model` is required".to_owned()))?
        .to_owned();
    Ok((json, model))
}

/// The client's headers a family passes on (Anthropic's version and betas).
fn forwarded_headers(family: Family, headers: &HeaderMap) -> Vec<(&'static str, String)> {
    match family {
        Family::Openai => Vec::new(),
        Family::Anthropic => {
            let of = |name: &str| {
                headers
                    .get(name)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned)
            };
            let mut forwarded = vec![(
                "anthropic-version",
                of("anthropic-version")
                    .unwrap_or_else(|| crate::store::ANTHROPIC_VERSION.to_owned()),
            )];
            if let Some(beta) = of("anthropic-beta") {
                forwarded.push(("anthropic-beta", beta));
            }
            forwarded
        }
    }
}

fn upstream_error(error: reqwest::Error) -> ApiError {
    if error.is_timeout() {
        ApiError::UpstreamTimeout
    } else {
        ApiError::UpstreamFailed(if error.is_connect() {
            "connecting failed".to_owned()
        } else {
            "the connection broke off".to_owned()
        })
    }
}

async fn forward(state: AppState, headers: HeaderMap, body: Bytes, endpoint: Endpoint) -> Response {
    let family = endpoint.family;
    match admitted(&state, &headers, &body, endpoint).await {
        Ok(prepared) => {
            // The call runs on in its own task whatever the client does.
            let handle = tokio::spawn(call(state, prepared));
            match handle.await {
                Ok(Ok(response)) => response,
                Ok(Err(error)) => StoreError::new(family, error).into_response(),
                Err(_) => {
                    StoreError::new(family, anyhow::anyhow!("a store call failed")).into_response()
                }
            }
        }
        Err(error) => StoreError::new(family, error).into_response(),
    }
}

/// An admitted call and what to send upstream.
struct Prepared {
    call: Call,
    upstream: reqwest::RequestBuilder,
    prices: TokenPrices,
    stream: bool,
    /// The gateway asked for a stream's usage: hide that chunk from the client.
    hide_usage: bool,
    /// How the upstream's answer reads (the endpoint's, or Anthropic's when translated).
    shape: Shape,
    /// A chat completion answered by an Anthropic model.
    translated: Option<Translated>,
}

async fn admitted(
    state: &AppState,
    headers: &HeaderMap,
    body: &Bytes,
    endpoint: Endpoint,
) -> Result<Prepared, ApiError> {
    let caller = caller(state, headers).await?;
    let (mut json, model_id) = parse(body)?;
    let (model, provider, translated) = find_model(state, endpoint, &json, &model_id)?;
    let stream = json.get("stream").and_then(Value::as_bool) == Some(true);
    let max_output = if endpoint.max_output.is_empty() {
        Some(0)
    } else {
        endpoint
            .max_output
            .iter()
            .find_map(|field| json.get(*field).and_then(Value::as_u64))
    };
    let worst = meter::worst_case(model, body.len(), max_output);
    let hold_for = std::time::Duration::from_secs(provider.settings.timeout_secs);
    let sent = match &translated {
        Some(translated) => translated.request(&json, model)?,
        None => Value::Null,
    };
    let asked = meter::Asked {
        kind: meter::Kind::Model,
        name: &model.settings.id,
        endpoint: endpoint.path.to_owned(),
        streamed: stream,
        hold_for,
        sandbox: caller.sandbox,
    };
    let call = meter::admit(state, &caller.principal, asked, worst).await?;
    if let Some(to_messages) = translated.as_ref().map(|translated| translated.to_messages) {
        let (path, family, shape) = if to_messages {
            (MESSAGES.path, Family::Anthropic, Shape::Anthropic)
        } else {
            (CHAT.path, Family::Openai, Shape::OpenaiChat)
        };
        let upstream = provider.post(
            path,
            sent.to_string().into_bytes(),
            &forwarded_headers(family, headers),
        );
        return Ok(Prepared {
            call,
            upstream,
            prices: model.prices,
            stream,
            hide_usage: false,
            shape,
            translated,
        });
    }
    json["model"] = Value::String(model.settings.upstream.clone());
    let hide_usage = stream && endpoint.path == CHAT.path && ask_for_usage(&mut json);
    let upstream = provider.post(
        endpoint.path,
        json.to_string().into_bytes(),
        &forwarded_headers(endpoint.family, headers),
    );
    Ok(Prepared {
        call,
        upstream,
        prices: model.prices,
        stream,
        hide_usage,
        shape: endpoint.shape,
        translated: None,
    })
}

/// The model a call names: of the endpoint's family, or — for chat completions and
/// messages — of the other family, answered through translation.
fn find_model<'a>(
    state: &'a AppState,
    endpoint: Endpoint,
    json: &Value,
    model_id: &str,
) -> Result<
    (
        &'a crate::store::Model,
        &'a crate::store::Provider,
        Option<Translated>,
    ),
    ApiError,
> {
    if let Some((model, provider)) = state.store.model(endpoint.family.name(), model_id) {
        return Ok((model, provider, None));
    }
    let other = match endpoint.path {
        path if path == CHAT.path => Some(Family::Anthropic),
        path if path == MESSAGES.path => Some(Family::Openai),
        _ => None,
    };
    if let Some(other) = other
        && let Some((model, provider)) = state.store.model(other.name(), model_id)
    {
        let include_usage = json
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let translated = Translated {
            model: model.settings.id.clone(),
            to_messages: matches!(other, Family::Anthropic),
            include_usage,
        };
        return Ok((model, provider, Some(translated)));
    }
    Err(ApiError::ModelNotFound(model_id.to_owned()))
}

/// Asks a chat stream for its usage when the client did not; whether it had to (the usage
/// chunk is then held back from the client).
fn ask_for_usage(json: &mut Value) -> bool {
    let asked = json
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool);
    if asked == Some(true) {
        return false;
    }
    match json
        .get_mut("stream_options")
        .and_then(Value::as_object_mut)
    {
        Some(options) => {
            options.insert("include_usage".to_owned(), Value::Bool(true));
        }
        None => json["stream_options"] = serde_json::json!({ "include_usage": true }),
    }
    true
}

/// Sends the call upstream and answers: refusals passed on (and nothing billed), a whole
/// answer settled before it is returned, a stream returned at once and settled at its end.
async fn call(state: AppState, prepared: Prepared) -> Result<Response, ApiError> {
    let Prepared {
        call,
        upstream,
        prices,
        stream,
        hide_usage,
        shape,
        translated,
    } = prepared;
    let answer = match upstream.send().await {
        Ok(answer) => answer,
        Err(error) => {
            meter::release(&state, &call).await;
            return Err(upstream_error(error));
        }
    };
    let status = answer.status();
    let first_byte = call.started.elapsed();
    if matches!(status.as_u16(), 401 | 403) {
        tracing::error!(status = %status, model = %call.name, "the provider refused the operator's credential");
        meter::release(&state, &call).await;
        return Err(ApiError::UpstreamAuthFailed);
    }
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    if !status.is_success() {
        let retry_after = answer.headers().get(header::RETRY_AFTER).cloned();
        let mut bytes = answer.bytes().await.unwrap_or_default();
        meter::release(&state, &call).await;
        let mut content_type = content_type;
        if let Some(translated) = &translated {
            bytes = translated.error(status.as_u16(), &bytes);
            content_type = Some(HeaderValue::from_static("application/json"));
        }
        let mut response = whole(status, content_type, bytes, None);
        if let Some(value) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return Ok(response);
    }
    let id = call.id;
    if stream {
        let translator = translated.map(|translated| translated.stream());
        let taps = Taps {
            tap: Tap::new(shape, hide_usage),
            translator,
        };
        let body = streamed(state, call, prices, answer, taps);
        return Ok(whole(status, content_type, Bytes::new(), Some(id)).map(|_| body));
    }
    let bytes = answer.bytes().await;
    let bytes = match bytes {
        Ok(bytes) => bytes,
        Err(error) => {
            meter::release(&state, &call).await;
            return Err(upstream_error(error));
        }
    };
    let parsed = serde_json::from_slice::<Value>(&bytes).ok();
    let usage = parsed
        .as_ref()
        .and_then(|json| usage::from_body(shape, json));
    let outcome = Outcome {
        status: status.as_u16(),
        usage,
        estimate_if_unknown: true,
        first_byte: Some(first_byte),
    };
    // Settled after the answer: the reservation holds the money until the debit is booked.
    tokio::spawn(async move {
        if let Err(error) = meter::settle(&state, call, &prices, outcome).await {
            tracing::error!(error = format!("{error:#}"), "settling a store call");
        }
    });
    let (content_type, bytes) = match (&translated, parsed) {
        (Some(translated), Some(answer)) => (
            Some(HeaderValue::from_static("application/json")),
            translated.answer(&answer),
        ),
        _ => (content_type, bytes),
    };
    Ok(whole(status, content_type, bytes, Some(id)))
}

/// A response with the upstream's status, content type and body, naming the store request.
fn whole(
    status: StatusCode,
    content_type: Option<HeaderValue>,
    bytes: Bytes,
    id: Option<uuid::Uuid>,
) -> Response {
    let mut response = (status, bytes).into_response();
    if let Some(value) = content_type {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    if let Some(id) = id
        && let Ok(value) = HeaderValue::from_str(&id.to_string())
    {
        response.headers_mut().insert(REQUEST_HEADER, value);
    }
    response
}

/// What a stream passes through: the usage tap, then the translation when there is one.
struct Taps {
    tap: Tap,
    translator: Option<Translator>,
}

/// The stream passed through the tap as it comes; the task reading it settles the call at
/// the end, and reads on (for at most the drain time) once the client went away.
fn streamed(
    state: AppState,
    call: Call,
    prices: TokenPrices,
    answer: reqwest::Response,
    taps: Taps,
) -> Body {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(32);
    tokio::spawn(async move {
        let Taps {
            mut tap,
            mut translator,
        } = taps;
        let mut upstream = answer.bytes_stream();
        let mut gone: Option<Instant> = None;
        let mut status = 200;
        let mut first_byte = None;
        loop {
            let next = match gone {
                Some(since) => {
                    let left = state.store.drain.saturating_sub(since.elapsed());
                    tokio::time::timeout(left, upstream.next())
                        .await
                        .unwrap_or(None)
                }
                None => upstream.next().await,
            };
            match next {
                Some(Ok(chunk)) => {
                    first_byte.get_or_insert_with(|| call.started.elapsed());
                    let mut out = tap.feed(&chunk);
                    if let Some(translator) = translator.as_mut() {
                        out = translator.feed(&out);
                    }
                    if gone.is_none() && !out.is_empty() && sender.send(Ok(out)).await.is_err() {
                        gone = Some(Instant::now());
                    }
                }
                Some(Err(error)) => {
                    status = 502;
                    let _ = sender.send(Err(std::io::Error::other(error))).await;
                    break;
                }
                None => break,
            }
        }
        let mut rest = tap.finish();
        if let Some(translator) = translator.as_mut() {
            let mut translated = translator.feed(&rest).to_vec();
            translated.extend_from_slice(&translator.finish());
            rest = Bytes::from(translated);
        }
        if gone.is_none() && !rest.is_empty() {
            let _ = sender.send(Ok(rest)).await;
        }
        drop(sender);
        let outcome = Outcome {
            status,
            usage: tap.usage(),
            estimate_if_unknown: true,
            first_byte,
        };
        if let Err(error) = meter::settle(&state, call, &prices, outcome).await {
            tracing::error!(
                error = format!("{error:#}"),
                "settling a streamed store call"
            );
        }
    });
    let chunks = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    });
    Body::from_stream(chunks)
}
