//! The two machine credentials: a worker's own credential on its calls to the internal plane
//! (the `x-sandbase-node-token` header, checked against the worker it names), and the operator token on `/v1/admin/*` and template
//! operations (`Authorization: Bearer <operator token>`). Neither opens the other's routes.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sandbase_api::internal::NODE_TOKEN_HEADER;
use secrecy::ExposeSecret;
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

/// A worker, by the credential it presented (`x-sandbase-node-token`): the id it names.
/// What the worker says about itself must be about this id ([`WorkerIdentity::speaks_for`]).
pub struct WorkerIdentity(pub String);

impl WorkerIdentity {
    /// 403 `worker_mismatch` unless `worker_id` is this worker's own.
    pub fn speaks_for(&self, worker_id: &str) -> Result<(), ApiError> {
        if self.0 == worker_id {
            Ok(())
        } else {
            Err(ApiError::WorkerMismatch)
        }
    }
}

impl FromRequestParts<AppState> for WorkerIdentity {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        parts
            .headers
            .get(NODE_TOKEN_HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(|presented| state.sandboxes.worker_client.verify(presented))
            .map(|worker_id| WorkerIdentity(worker_id.to_owned()))
            .ok_or(ApiError::InvalidNodeToken)
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
