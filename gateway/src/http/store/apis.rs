//! `ANY /store/apis/{name}/{path…}`: a paid API called with the caller's SandBase key,
//! forwarded to the operator's upstream with the operator's credential injected (the caller
//! never sees it, the upstream never sees the caller's key), priced per call and per MiB of
//! answer, admitted and settled like a model call. A refusal of the operator's credential is
//! 502 `upstream_auth_failed`; the upstream's 429 and 5xx pass through and cost nothing.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use secrecy::ExposeSecret;

use super::caller::caller;
use super::forward::REQUEST_HEADER;
use crate::config::Injection;
use crate::error::ApiError;
use crate::http::client_ip::ClientIp;
use crate::http::extract::ApiPath;
use crate::state::AppState;
use crate::store::PaidApi;
use crate::store::meter::{self, Asked, Kind, Settled};

/// The client's headers passed on (never its credentials or cookies).
const FORWARDED: [header::HeaderName; 3] =
    [header::CONTENT_TYPE, header::ACCEPT, header::USER_AGENT];

pub async fn forward_root(
    state: State<AppState>,
    ip: ClientIp,
    ApiPath(name): ApiPath<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    forward(
        state,
        ip,
        ApiPath((name, String::new())),
        method,
        uri,
        headers,
        body,
    )
    .await
}

pub async fn forward(
    State(state): State<AppState>,
    ClientIp(ip): ClientIp,
    ApiPath((name, path)): ApiPath<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let caller = caller(&state, &headers, ip).await?;
    let api = state
        .store
        .api(&name)
        .ok_or_else(|| ApiError::StoreApiNotFound(name.clone()))?;
    // The segments from the raw path, decoded once here (not the router's decoding, which
    // would hide `%2F` and let `%252e` through as `%2e`).
    let raw = uri
        .path()
        .strip_prefix("/store/apis/")
        .and_then(|rest| rest.split_once('/'))
        .map_or("", |(_, rest)| rest);
    let segments = sandbase_api::segments::decoded(raw).map_err(ApiError::InvalidRequest)?;
    let url = upstream_url(api, &segments, uri.query())?;
    let worst = api.cost(api.settings.max_response_bytes);
    let asked = Asked {
        kind: Kind::Api,
        name: &api.settings.name,
        listed_as: format!("api:{}", api.settings.name),
        endpoint: format!("{method} /{}", path.chars().take(200).collect::<String>()),
        streamed: false,
        hold_for: std::time::Duration::from_secs(api.settings.timeout_secs),
        sandbox: caller.sandbox,
    };
    let call = meter::admit(&state, &caller.principal, asked, worst).await?;
    let request = upstream_request(api, &method, url, &headers, body);
    // The call runs to its end in a task of its own: a client that leaves does not stop it
    // (the upstream charges for it all the same), and it is settled.
    let answered = tokio::spawn(call_upstream(
        state.clone(),
        api.settings.name.clone(),
        call,
        request,
    ))
    .await
    .map_err(|error| ApiError::Internal(anyhow::anyhow!("a paid API call's task: {error}")))??;
    let mut response = (answered.status, answered.bytes).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, answered.content_type),
        (header::RETRY_AFTER, answered.retry_after),
    ] {
        if let Some(value) = value {
            headers.insert(name, value);
        }
    }
    if let Ok(value) = HeaderValue::from_str(&answered.id.to_string()) {
        headers.insert(REQUEST_HEADER, value);
    }
    Ok(response)
}

/// What a paid API answered, to pass back.
struct Answered {
    status: axum::http::StatusCode,
    bytes: Bytes,
    content_type: Option<HeaderValue>,
    retry_after: Option<HeaderValue>,
    id: uuid::Uuid,
}

/// Sends an admitted call of the API `name` and settles it: its reservation released when it
/// cost nothing (unreachable, the credential refused, 429, 5xx), its price booked otherwise.
async fn call_upstream(
    state: AppState,
    name: String,
    call: meter::Call,
    request: reqwest::RequestBuilder,
) -> Result<Answered, ApiError> {
    let api = state
        .store
        .api(&name)
        .ok_or_else(|| ApiError::StoreApiNotFound(name.clone()))?;
    let answer = match request.send().await {
        Ok(answer) => answer,
        Err(error) => {
            meter::release(&state, &call).await;
            return Err(if error.is_timeout() {
                ApiError::UpstreamTimeout
            } else {
                ApiError::UpstreamFailed("the API could not be reached".to_owned())
            });
        }
    };
    let status = answer.status();
    let first_byte = call.started.elapsed();
    if matches!(status.as_u16(), 401 | 403) {
        tracing::error!(api = %name, status = %status, "the API refused the operator's credential");
        meter::release(&state, &call).await;
        return Err(ApiError::UpstreamAuthFailed);
    }
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let retry_after = answer.headers().get(header::RETRY_AFTER).cloned();
    let bytes = match read_bounded(answer, api.settings.max_response_bytes).await {
        Ok(bytes) => bytes,
        Err(error) => {
            meter::release(&state, &call).await;
            return Err(error);
        }
    };
    let id = call.id;
    if status.as_u16() == 429 || status.is_server_error() {
        meter::release(&state, &call).await;
    } else {
        let settled = Settled {
            status: status.as_u16(),
            usage: Default::default(),
            cost: api.cost(bytes.len() as u64),
            estimated: false,
            first_byte: Some(first_byte),
            bytes: bytes.len() as u64,
        };
        // Booked after the answer: the reservation holds the money until then.
        let booking = state.clone();
        tokio::spawn(async move {
            if let Err(error) = meter::book(&booking, call, settled).await {
                tracing::error!(error = format!("{error:#}"), "settling a paid API call");
            }
        });
    }
    Ok(Answered {
        status,
        bytes,
        content_type,
        retry_after,
        id,
    })
}

/// The upstream URL: `{base_url}/{segments}?{query}`, each segment pushed on its own
/// (percent-encoded again, so none can be read as `/`, `..` or a query) and the result
/// checked to be under the base; with the operator's credential as a query parameter when
/// the API takes it so (the client's own parameter of that name is dropped, not passed
/// beside it).
fn upstream_url(
    api: &PaidApi,
    segments: &[String],
    query: Option<&str>,
) -> Result<reqwest::Url, ApiError> {
    let invalid = || ApiError::InvalidRequest("the path is not a valid URL path".to_owned());
    let base = reqwest::Url::parse(&api.settings.base_url).map_err(|_| invalid())?;
    let mut url = base.clone();
    if !segments.is_empty() {
        url.path_segments_mut()
            .map_err(|()| invalid())?
            .pop_if_empty()
            .extend(segments);
    }
    let base_path = base.path().trim_end_matches('/');
    if url.host() != base.host()
        || url.port_or_known_default() != base.port_or_known_default()
        || !url.path().starts_with(base_path)
    {
        return Err(ApiError::InvalidRequest(
            "the path leads outside the API".to_owned(),
        ));
    }
    let inject_query = match &api.settings.inject {
        Injection::Query(name) => Some(name.as_str()),
        Injection::Bearer | Injection::Header(_) => None,
    };
    let kept: Vec<&str> = query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| inject_query.is_none_or(|name| pair.split('=').next() != Some(name)))
        .collect();
    if !kept.is_empty() {
        url.set_query(Some(&kept.join("&")));
    }
    if let (Some(name), Some(credential)) = (inject_query, api.credential.get()) {
        url.query_pairs_mut()
            .append_pair(name, credential.expose_secret());
    }
    Ok(url)
}

/// The upstream request: the client's harmless headers, the operator's credential where
/// the API takes it.
fn upstream_request(
    api: &PaidApi,
    method: &Method,
    url: reqwest::Url,
    headers: &HeaderMap,
    body: Bytes,
) -> reqwest::RequestBuilder {
    let mut request = api.client.request(method.clone(), url).body(body);
    for name in FORWARDED {
        if let Some(value) = headers.get(&name) {
            request = request.header(name, value);
        }
    }
    if let Some(credential) = api.credential.get() {
        match &api.settings.inject {
            Injection::Bearer => request = request.bearer_auth(credential.expose_secret()),
            Injection::Header(name) => request = request.header(name, credential.expose_secret()),
            // In the URL (`upstream_url`).
            Injection::Query(_) => {}
        }
    }
    request
}

/// The answer's body, refused past `limit` bytes.
async fn read_bounded(answer: reqwest::Response, limit: u64) -> Result<Bytes, ApiError> {
    let mut stream = answer.bytes_stream();
    let mut body = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|_| ApiError::UpstreamFailed("the answer broke off".to_owned()))?;
        body.extend_from_slice(&chunk);
        if body.len() as u64 > limit {
            return Err(ApiError::UpstreamFailed(format!(
                "the answer is larger than the {limit} bytes this API may return"
            )));
        }
    }
    Ok(Bytes::from(body))
}
