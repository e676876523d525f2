//! The one check of the node token: workers' calls to the internal API (the
//! `x-sandbase-node-token` header) and the operator's routes (the same header, or
//! `Authorization: Bearer <node token>`).

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sandbase_api::internal::NODE_TOKEN_HEADER;

use crate::error::ApiError;
use crate::state::AppState;

/// A caller that presented this deployment's node token in its header: a worker, or the
/// operator's tools.
pub struct NodeToken;

impl FromRequestParts<AppState> for NodeToken {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match parts.headers.get(NODE_TOKEN_HEADER) {
            Some(presented) if state.worker_client.accepts(presented.as_bytes()) => Ok(NodeToken),
            _ => Err(ApiError::InvalidNodeToken),
        }
    }
}

/// The operator, by the node token as `Authorization: Bearer …` or in the node-token header.
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let bearer = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::as_bytes);
        let header = parts
            .headers
            .get(NODE_TOKEN_HEADER)
            .map(|value| value.as_bytes());
        if [bearer, header]
            .into_iter()
            .flatten()
            .any(|presented| state.worker_client.accepts(presented))
        {
            Ok(Operator)
        } else {
            Err(ApiError::InvalidOperatorToken)
        }
    }
}
