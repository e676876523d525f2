//! The audit layer of the API routes: it prepares each request's [`AuditSlot`] (handlers
//! receive it as a [`RequestContext`]), and after the handler writes the row of a failed
//! mutation or a failed authentication (the latter aggregated per address and credential).

use std::net::IpAddr;

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::request_id::RequestId;
use crate::audit::{AuditSlot, Entry, RequestContext, insert};
use crate::error::ApiError;
use crate::failed_auth::{FailureKey, credential_label};
use crate::state::AppState;

impl<S: Send + Sync> FromRequestParts<S> for RequestContext {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let slot = parts
            .extensions
            .get::<AuditSlot>()
            .cloned()
            .ok_or_else(|| {
                ApiError::Internal(anyhow::anyhow!(
                    "audit middleware is not installed on this route"
                ))
            })?;
        Ok(RequestContext::new(slot))
    }
}

/// Route layer: prepares the slot, and after the handler writes the row of a failed
/// mutation or a failed authentication (aggregated: see `failed_auth`).
pub async fn middleware(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let slot = AuditSlot::new(
        request.method().clone(),
        request
            .extensions()
            .get::<MatchedPath>()
            .map_or_else(String::new, |path| path.as_str().to_owned()),
        request
            .extensions()
            .get::<RequestId>()
            .map(|id| id.0.clone()),
        super::client_ip::client_ip(&request, &state.settings.server.trusted_proxies),
    );
    // Kept (a reference-counted clone) for the failure path only; most requests never
    // need its label.
    let authorization = request.headers().get(header::AUTHORIZATION).cloned();
    request.extensions_mut().insert(slot.clone());

    let response = next.run(request).await;

    let entry = failure_row(&state, &slot, authorization, response.status());
    if let Some((entry, request_id, source_ip)) = entry {
        let result = async {
            let mut connection = state.db.acquire().await?;
            insert(&mut connection, &entry, request_id.as_deref(), source_ip).await
        }
        .await;
        if let Err(error) = result {
            tracing::error!(error = %error, action = %entry.action, "writing an audit row failed");
        }
    }
    response
}

type Row = (Entry, Option<String>, Option<IpAddr>);

/// The row a request that failed leaves, if any: a failed authentication (the first of its
/// window; the rest are counted), or a refused or failed mutation (not a 429: a flood must
/// not turn into a flood of PostgreSQL writes).
fn failure_row(
    state: &AppState,
    slot: &AuditSlot,
    authorization: Option<HeaderValue>,
    status: StatusCode,
) -> Option<Row> {
    let slot_state = slot.lock();
    if slot_state.written {
        return None;
    }
    let method = &slot_state.method;
    let target = format!("{method} {}", slot_state.route);
    if let Some(team_id) = slot_state.authentication_failure {
        let credential =
            credential_label(authorization.as_ref().and_then(|value| value.to_str().ok()));
        let key = FailureKey {
            source_ip: slot_state.source_ip,
            credential: credential.clone(),
            team_id,
        };
        if !state.auth.failed_auth.note(key, &target, status.as_u16()) {
            return None;
        }
        let entry = Entry {
            team_id,
            actor_type: "anonymous",
            actor_id: None,
            action: "auth.failed".to_owned(),
            target: Some(target),
            outcome: "denied",
            status_code: Some(status.as_u16()),
            details: serde_json::json!({ "count": 1, "credential": credential }),
        };
        return Some((entry, slot_state.request_id.clone(), slot_state.source_ip));
    }
    let mutating = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !mutating || status == StatusCode::TOO_MANY_REQUESTS || status.is_success() {
        return None;
    }
    let (team_id, actor_type, actor_id) = match &slot_state.principal {
        Some(principal) => (
            Some(principal.team_id),
            principal.actor_type(),
            Some(principal.actor_id()),
        ),
        None => (None, "anonymous", None),
    };
    let outcome = if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        "denied"
    } else {
        "failure"
    };
    let entry = Entry {
        team_id,
        actor_type,
        actor_id,
        action: slot_state.action(),
        target: None,
        outcome,
        status_code: Some(status.as_u16()),
        details: serde_json::json!({}),
    };
    Some((entry, slot_state.request_id.clone(), slot_state.source_ip))
}
