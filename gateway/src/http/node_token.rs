//! The two machine credentials: the node token on workers' calls to the internal plane (the
//! `x-sandbase-node-token` header), and the operator token on `/v1/admin/*` and template
//! operations (`Authorization: Bearer <operator token>`). Neither opens the other's routes.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sandbase_api::internal::NODE_TOKEN_HEADER;
use secrecy::ExposeSecret;
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

/// A caller that presented this deployment's node token in its header: a worker.
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

/// The operator, by the operator token (`auth.operator_token`) as `Authorization: Bearer …`.
/// A worker's node token is not enough.
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let presented = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        let expected = state.settings.auth.operator_token.as_ref();
        match (presented, expected) {
            (Some(presented), Some(expected))
                if bool::from(
                    presented
                        .as_bytes()
                        .ct_eq(expected.expose_secret().as_bytes()),
                ) =>
            {
                Ok(Operator)
            }
            _ => Err(ApiError::InvalidOperatorToken),
        }
    }
}
