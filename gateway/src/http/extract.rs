//! Extractors whose rejections answer in the API's error format instead of axum's plain text.

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;

/// `axum::Json`, with rejections mapped to `invalid_json` (400), `invalid_request` (422),
/// `payload_too_large` (413) and `unsupported_media_type` (415). A number with a zero
/// fractional part (`2.0`) is an integer, as JSON Schema (and so the OpenAPI document) has it.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !json_content_type(request.headers()) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(bytes_rejection)?;
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(JsonRejection::JsonDataError(error))
                if error.body_text().contains("invalid type: floating point") =>
            {
                let mut value: Value = serde_json::from_slice(&bytes)
                    .map_err(|_| ApiError::InvalidRequest(error.body_text()))?;
                integral_numbers_as_integers(&mut value);
                serde_json::from_value(value)
                    .map(ApiJson)
                    .map_err(|_| ApiError::InvalidRequest(error.body_text()))
            }
            Err(rejection) => Err(map_json_rejection(rejection)),
        }
    }
}

/// `application/json`, or any `application/…+json`, as axum's `Json` accepts.
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Rewrites every number with a zero fractional part that fits an integer as that integer.
fn integral_numbers_as_integers(value: &mut Value) {
    match value {
        Value::Number(number) if number.is_f64() => {
            let float = number.as_f64().unwrap_or(f64::NAN);
            if float.fract() == 0.0 && float.abs() < 9.0e15 {
                *value = Value::from(float as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(integral_numbers_as_integers),
        _ => {}
    }
}

fn bytes_rejection(error: BytesRejection) -> ApiError {
    if error.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge
    } else {
        ApiError::InvalidJson(error.body_text())
    }
}

fn map_json_rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::JsonDataError(error) => ApiError::InvalidRequest(error.body_text()),
        JsonRejection::JsonSyntaxError(error) => ApiError::InvalidJson(error.body_text()),
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType,
        JsonRejection::BytesRejection(error) => bytes_rejection(error),
        other => ApiError::InvalidJson(other.body_text()),
    }
}

/// `axum::extract::Query` with rejections mapped to `invalid_request` (422).
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // No parameter may hold a NUL byte: none means anything with one, and PostgreSQL's
        // text refuses it (the fuzzer found an audit filter answering 500).
        if parts
            .uri
            .query()
            .is_some_and(|query| query.to_ascii_lowercase().contains("%00"))
        {
            return Err(ApiError::InvalidRequest(
                "a query parameter holds a NUL byte".to_owned(),
            ));
        }
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(map_query_rejection(rejection)),
        }
    }
}

fn map_query_rejection(rejection: QueryRejection) -> ApiError {
    ApiError::InvalidRequest(rejection.body_text())
}

/// `axum::extract::Path`; a malformed id is answered 404 (there is no such resource) rather than 400.
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(PathRejection::FailedToDeserializePathParams(_)) => {
                Err(ApiError::NotFound("resource"))
            }
            Err(rejection) => Err(ApiError::Internal(anyhow::anyhow!(
                "path extraction failed: {}",
                rejection.body_text()
            ))),
        }
    }
}

/// Who attaches to a terminal: the bearer of a single-use ticket (`?ticket=`, for browsers,
/// whose WebSockets cannot send headers), else an authenticated member of the team.
pub struct TerminalCaller {
    pub team_id: uuid::Uuid,
    /// The ticket's grant, which the handler checks against the session asked for.
    pub ticket: Option<crate::sandboxes::terminals::TicketGrant>,
}

impl FromRequestParts<crate::state::AppState> for TerminalCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &crate::state::AppState,
    ) -> Result<Self, Self::Rejection> {
        // Tickets are hexadecimal: nothing to decode.
        let ticket = parts.uri.query().and_then(|query| {
            query
                .split('&')
                .find_map(|pair| pair.strip_prefix("ticket="))
                .map(str::to_owned)
        });
        if let Some(ticket) = ticket {
            let grant = crate::sandboxes::terminals::redeem_ticket(state, &ticket)
                .await?
                .ok_or(ApiError::InvalidTicket)?;
            return Ok(TerminalCaller {
                team_id: grant.team_id,
                ticket: Some(grant),
            });
        }
        let principal = crate::auth::Principal::from_request_parts(parts, state).await?;
        principal.require(sandbase_api::Role::Member)?;
        Ok(TerminalCaller {
            team_id: principal.team_id,
            ticket: None,
        })
    }
}
