//! The store's model routes: the caller authenticated from the request's headers, the call
//! made by `store::call` (admission, the upstream request, the answer, settlement), its
//! answer sent back as it comes — whole, or a stream — and refusals in the family's shape.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::caller::caller;
use super::errors::StoreError;
use crate::http::client_ip::ClientIp;
use crate::state::AppState;
use crate::store::Family;
use crate::store::call::{self, Answer, ClientHeaders, Endpoint, ModelCall};

/// The header naming the store's record of the call (`GET /v1/store/requests/{id}`).
pub const REQUEST_HEADER: &str = "x-sandbase-store-request";

pub async fn openai_chat(
    state: State<AppState>,
    ip: ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    forward(state, ip, headers, body, Endpoint::Chat).await
}

pub async fn openai_responses(
    state: State<AppState>,
    ip: ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    forward(state, ip, headers, body, Endpoint::Responses).await
}

pub async fn openai_embeddings(
    state: State<AppState>,
    ip: ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    forward(state, ip, headers, body, Endpoint::Embeddings).await
}

pub async fn anthropic_messages(
    state: State<AppState>,
    ip: ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    forward(state, ip, headers, body, Endpoint::Messages).await
}

/// Token counting is free: forwarded for an authenticated caller, not metered.
pub async fn anthropic_count_tokens(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let counted = async {
        let caller = caller(&state, &headers, ip).await?;
        call::count_tokens(&state, &caller, &body, &client_headers(&headers)).await
    };
    match counted.await {
        Ok(answer) => response(answer),
        Err(error) => StoreError::new(Family::Anthropic, error).into_response(),
    }
}

async fn forward(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    headers: HeaderMap,
    body: Bytes,
    endpoint: Endpoint,
) -> Response {
    let answered = async {
        let caller = caller(&state, &headers, ip).await?;
        let request = ModelCall {
            endpoint,
            body,
            headers: client_headers(&headers),
        };
        call::call(&state, &caller, request).await
    };
    match answered.await {
        Ok(answer) => response(answer),
        Err(error) => StoreError::new(endpoint.family(), error).into_response(),
    }
}

/// The client's headers a provider takes (Anthropic's version and betas).
fn client_headers(headers: &HeaderMap) -> ClientHeaders {
    let of = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    ClientHeaders {
        anthropic_version: of("anthropic-version"),
        anthropic_beta: of("anthropic-beta"),
    }
}

/// The store's answer as the client receives it: the provider's status, content type and
/// body (or stream), `Retry-After` on a refusal, and the store's record of the call.
fn response(answer: Answer) -> Response {
    let (status, content_type, retry_after, request_id, body) = match answer {
        Answer::Whole(whole) => (
            whole.status,
            whole.content_type,
            whole.retry_after,
            whole.request_id,
            Body::from(whole.body),
        ),
        Answer::Stream(streamed) => (
            streamed.status,
            streamed.content_type,
            None,
            Some(streamed.request_id),
            Body::from_stream(streamed.body),
        ),
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    // A provider that names no type gets the one a body of bytes has.
    let content_type =
        content_type.unwrap_or_else(|| HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_TYPE, content_type);
    if let Some(value) = retry_after {
        headers.insert(header::RETRY_AFTER, value);
    }
    if let Some(value) = request_id.and_then(|id| HeaderValue::from_str(&id.to_string()).ok()) {
        headers.insert(REQUEST_HEADER, value);
    }
    response
}
