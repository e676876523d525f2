//! The append-only audit log.
//!
//! Successful mutations write their row inside the same transaction as the change
//! ([`RequestContext::record`]), so a change never lands without its record. The
//! [`middleware`] writes the rows of everything that failed: a mutating call that was
//! refused or errored, and any failed authentication, on any route.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::request_id::RequestId;
use crate::state::AppState;

/// Per-request audit context, shared between the middleware and the handler. It is made
/// for every API request, so it holds only cheap values; the action name is derived when
/// a row is written.
#[derive(Clone)]
pub struct AuditSlot(Arc<Mutex<SlotState>>);

struct SlotState {
    method: Method,
    route: Option<MatchedPath>,
    request_id: Option<String>,
    source_ip: Option<IpAddr>,
    /// The authenticated caller (cheap to clone: the key record is shared).
    principal: Option<Principal>,
    /// Set when authentication failed; holds the team the credential belonged to, if known.
    authentication_failure: Option<Option<Uuid>>,
    /// Set when the handler wrote its own row.
    written: bool,
}

impl SlotState {
    fn route(&self) -> &str {
        self.route.as_ref().map_or("", MatchedPath::as_str)
    }

    fn action(&self) -> String {
        action_name(&self.method, self.route())
    }
}

impl AuditSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set_principal(&self, principal: &Principal) {
        self.lock().principal = Some(principal.clone());
    }

    pub fn set_authentication_failure(&self, team_id: Option<Uuid>) {
        self.lock().authentication_failure = Some(team_id);
    }
}

/// Handler-side access to the request's audit context: request id, client address,
/// and the action name of the matched route.
pub struct RequestContext {
    slot: AuditSlot,
}

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
        Ok(RequestContext { slot })
    }
}

/// One row to write.
pub struct Entry {
    pub team_id: Option<Uuid>,
    pub actor_type: &'static str,
    pub actor_id: Option<String>,
    pub action: String,
    pub target: Option<String>,
    pub outcome: &'static str,
    pub status_code: Option<u16>,
    pub details: serde_json::Value,
}

impl RequestContext {
    /// Records a successful change by `principal` inside the change's own transaction.
    pub async fn record(
        &self,
        executor: &mut sqlx::PgConnection,
        principal: &Principal,
        target: Option<String>,
        details: serde_json::Value,
    ) -> Result<(), sqlx::Error> {
        self.record_as(
            executor,
            Some(principal.team_id),
            principal.actor_type(),
            Some(principal.actor_id()),
            target,
            details,
        )
        .await
    }

    /// Records a successful change by an actor that is not a [`Principal`] (sign-up, login).
    pub async fn record_as(
        &self,
        executor: &mut sqlx::PgConnection,
        team_id: Option<Uuid>,
        actor_type: &'static str,
        actor_id: Option<String>,
        target: Option<String>,
        details: serde_json::Value,
    ) -> Result<(), sqlx::Error> {
        let (action, request_id, source_ip) = {
            let state = self.slot.lock();
            (state.action(), state.request_id.clone(), state.source_ip)
        };
        insert(
            executor,
            &Entry {
                team_id,
                actor_type,
                actor_id,
                action,
                target,
                outcome: "success",
                status_code: None,
                details,
            },
            request_id.as_deref(),
            source_ip,
        )
        .await?;
        self.slot.lock().written = true;
        Ok(())
    }
}

/// Writes one audit row.
pub async fn insert(
    executor: &mut sqlx::PgConnection,
    entry: &Entry,
    request_id: Option<&str>,
    source_ip: Option<IpAddr>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO audit_events \
           (team_id, actor_type, actor_id, action, target, source_ip, request_id, outcome, status_code, details) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(entry.team_id)
    .bind(entry.actor_type)
    .bind(&entry.actor_id)
    .bind(&entry.action)
    .bind(&entry.target)
    .bind(source_ip.map(|ip| ip.to_string()))
    .bind(request_id)
    .bind(entry.outcome)
    .bind(entry.status_code.map(i32::from))
    .bind(&entry.details)
    .execute(executor)
    .await?;
    Ok(())
}

/// Route layer: prepares the slot, and after the handler writes the row of a failed
/// mutation or a failed authentication.
pub async fn middleware(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let slot = AuditSlot(Arc::new(Mutex::new(SlotState {
        method: request.method().clone(),
        route: request.extensions().get::<MatchedPath>().cloned(),
        request_id: request
            .extensions()
            .get::<RequestId>()
            .map(|id| id.0.clone()),
        source_ip: client_ip(&request, state.settings.server.trust_forwarded_for),
        principal: None,
        authentication_failure: None,
        written: false,
    })));
    request.extensions_mut().insert(slot.clone());

    let response = next.run(request).await;

    let status = response.status();
    let entry = {
        let slot_state = slot.lock();
        if slot_state.written {
            return response;
        }
        let method = &slot_state.method;
        let mutating = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        if let Some(team_id) = slot_state.authentication_failure {
            Some((
                Entry {
                    team_id,
                    actor_type: "anonymous",
                    actor_id: None,
                    action: "auth.failed".to_owned(),
                    target: Some(format!("{method} {}", slot_state.route())),
                    outcome: "denied",
                    status_code: Some(status.as_u16()),
                    details: serde_json::json!({}),
                },
                slot_state.request_id.clone(),
                slot_state.source_ip,
            ))
        } else if mutating && status != StatusCode::TOO_MANY_REQUESTS && !status.is_success() {
            // Rate-limited calls are counted in metrics, not written: a flood must not turn
            // into a flood of Postgres writes.
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
            Some((
                Entry {
                    team_id,
                    actor_type,
                    actor_id,
                    action: slot_state.action(),
                    target: None,
                    outcome,
                    status_code: Some(status.as_u16()),
                    details: serde_json::json!({}),
                },
                slot_state.request_id.clone(),
                slot_state.source_ip,
            ))
        } else {
            None
        }
    };
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

/// The audit action of each mutating route.
const ACTIONS: &[(&str, &str, &str)] = &[
    ("POST", "/v1/auth/signup", "auth.signup"),
    ("POST", "/v1/auth/login", "auth.login"),
    ("POST", "/v1/api-keys", "api_key.create"),
    ("DELETE", "/v1/api-keys/{id}", "api_key.revoke"),
    ("POST", "/v1/team/members", "member.add"),
    ("PATCH", "/v1/team/members/{user_id}", "member.update"),
    ("DELETE", "/v1/team/members/{user_id}", "member.remove"),
    ("POST", "/v1/sandboxes", "sandbox.create"),
    ("DELETE", "/v1/sandboxes/{id}", "sandbox.destroy"),
    ("POST", "/v1/sandboxes/{id}/timeout", "sandbox.extend"),
    ("POST", "/v1/sandboxes/{id}/exec", "sandbox.exec"),
    (
        "POST",
        "/v1/sandboxes/{id}/processes/{pid}/stdin",
        "sandbox.process.stdin",
    ),
    (
        "POST",
        "/v1/sandboxes/{id}/processes/{pid}/signal",
        "sandbox.process.signal",
    ),
    ("PUT", "/v1/sandboxes/{id}/files", "sandbox.file.write"),
    ("DELETE", "/v1/sandboxes/{id}/files", "sandbox.file.remove"),
    ("PUT", "/v1/sandboxes/{id}/archive", "sandbox.archive.write"),
    ("POST", "/v1/runs", "run.create"),
    ("POST", "/v1/billing/checkout", "billing.checkout"),
    (
        "POST",
        "/v1/billing/stripe/webhook",
        "billing.stripe_webhook",
    ),
];

fn action_name(method: &Method, route: &str) -> String {
    ACTIONS
        .iter()
        .find(|(action_method, action_route, _)| {
            *action_method == method.as_str() && *action_route == route
        })
        .map(|(_, _, name)| (*name).to_owned())
        .unwrap_or_else(|| format!("{} {route}", method.as_str().to_lowercase()))
}

fn client_ip(request: &Request, trust_forwarded_for: bool) -> Option<IpAddr> {
    if trust_forwarded_for
        && let Some(forwarded) = request
            .headers()
            .get("x-forwarded-for")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(',').next())
            .and_then(|value| value.trim().parse().ok())
    {
        return Some(forwarded);
    }
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip())
}
