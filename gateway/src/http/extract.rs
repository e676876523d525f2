//! Extractors whose rejections answer in the API's error format instead of axum's plain text.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// `axum::Json`, with rejections mapped to `invalid_json` (400), `invalid_request` (422),
/// `payload_too_large` (413) and `unsupported_media_type` (415).
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(map_json_rejection(rejection)),
        }
    }
}

fn map_json_rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::JsonDataError(error) => ApiError::InvalidRequest(error.body_text()),
        JsonRejection::JsonSyntaxError(error) => ApiError::InvalidJson(error.body_text()),
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType,
        JsonRejection::BytesRejection(error) => {
            if error.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge
            } else {
                ApiError::InvalidJson(error.body_text())
            }
        }
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
