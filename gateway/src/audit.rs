//! The append-only audit log.
//!
//! Successful mutations write their row inside the same transaction as the change
//! ([`Audit::record`]), so a change never lands without its record. Each handler names its
//! action first ([`RequestContext::action`]); the HTTP layer writes the rows of everything
//! that failed: a mutating call that was refused or errored (under the action the handler
//! named, or `METHOD route` when it failed before naming one), and any failed
//! authentication, on any route.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use http::Method;
use uuid::Uuid;

use crate::auth::Principal;

/// Per-request audit context, shared between the HTTP layer and the handler. It is made
/// for every API request, so it holds only cheap values.
#[derive(Clone)]
pub struct AuditSlot(Arc<Mutex<SlotState>>);

pub struct SlotState {
    pub method: Method,
    /// The matched route template (`/v1/sandboxes/{id}`).
    pub route: String,
    pub request_id: Option<String>,
    pub source_ip: Option<IpAddr>,
    /// The authenticated caller (cheap to clone: the key record is shared).
    pub principal: Option<Principal>,
    /// Set when authentication failed; holds the team the credential belonged to, if known.
    pub authentication_failure: Option<Option<Uuid>>,
    /// The action the handler named.
    pub action: Option<&'static str>,
    /// Set when the handler wrote its own row.
    pub written: bool,
}

impl SlotState {
    /// The action of a failure row: the handler's, or the route's when it named none.
    pub fn action(&self) -> String {
        match self.action {
            Some(action) => action.to_owned(),
            None => format!("{} {}", self.method.as_str().to_lowercase(), self.route),
        }
    }
}

impl AuditSlot {
    pub fn new(
        method: Method,
        route: String,
        request_id: Option<String>,
        source_ip: Option<IpAddr>,
    ) -> AuditSlot {
        AuditSlot(Arc::new(Mutex::new(SlotState {
            method,
            route,
            request_id,
            source_ip,
            principal: None,
            authentication_failure: None,
            action: None,
            written: false,
        })))
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
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

/// The request's audit context, as handlers receive it: request id and client address.
pub struct RequestContext {
    slot: AuditSlot,
}

impl RequestContext {
    pub fn new(slot: AuditSlot) -> RequestContext {
        RequestContext { slot }
    }

    /// Names the action this request performs (`sandbox.create`): its success row and, from
    /// here on, its failure row carry it.
    pub fn action(self, action: &'static str) -> Audit {
        self.slot.lock().action = Some(action);
        Audit {
            slot: self.slot,
            action,
        }
    }
}

/// A request's audit context with its action named.
pub struct Audit {
    slot: AuditSlot,
    action: &'static str,
}

/// Who asks for a change. A change commits with its audit row: domain functions that write
/// take the requester and record it in the change's own transaction.
#[derive(Clone, Copy)]
pub enum Requester<'a> {
    /// A person or an API key of the team, in a request whose action is named.
    Member {
        audit: &'a Audit,
        principal: &'a Principal,
    },
    /// A queued run's dispatcher, acting for the run: the run's own rows and its submission's
    /// audit row record what it does.
    Run,
}

impl<'a> Requester<'a> {
    pub fn member(audit: &'a Audit, principal: &'a Principal) -> Requester<'a> {
        Requester::Member { audit, principal }
    }

    /// The member asking, when a person or key asks.
    pub fn principal(self) -> Option<&'a Principal> {
        match self {
            Requester::Member { principal, .. } => Some(principal),
            Requester::Run => None,
        }
    }

    /// Writes the change's audit row inside the change's own transaction (a run's changes
    /// have no row of their own).
    pub async fn record(
        self,
        executor: &mut sqlx::PgConnection,
        target: Option<String>,
        details: serde_json::Value,
    ) -> Result<(), sqlx::Error> {
        match self {
            Requester::Member { audit, principal } => {
                audit.record(executor, principal, target, details).await
            }
            Requester::Run => Ok(()),
        }
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

impl Audit {
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
        let (request_id, source_ip) = {
            let state = self.slot.lock();
            (state.request_id.clone(), state.source_ip)
        };
        insert(
            executor,
            &Entry {
                team_id,
                actor_type,
                actor_id,
                action: self.action.to_owned(),
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
