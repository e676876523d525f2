//! Reading the audit log: filters by time, actor and action; newest first, with a cursor.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use sandbase_api::{AuditEvent, AuditPage, ErrorBody, Role};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiPath, ApiQuery};
use crate::state::AppState;

const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_audit))
        .routes(routes!(get_audit_event))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// Only events at or after this time (RFC 3339).
    from: Option<DateTime<Utc>>,
    /// Only events before this time (RFC 3339).
    to: Option<DateTime<Utc>>,
    /// Only events by this actor (a user id or an API key id).
    #[param(pattern = "^[^\\u0000]*$")]
    actor: Option<String>,
    /// Only events with this action, e.g. `api_key.create`; a trailing `*` matches a prefix (`member.*`).
    #[param(pattern = "^[^\\u0000]*$")]
    action: Option<String>,
    /// Only events with this outcome: `success`, `failure` or `denied`.
    #[param(pattern = "^(success|failure|denied)$")]
    outcome: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^[1-9][0-9]{0,18}$")]
    cursor: Option<String>,
    /// Page size, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct AuditRow {
    id: i64,
    occurred_at: DateTime<Utc>,
    team_id: Option<uuid::Uuid>,
    actor_type: String,
    actor_id: Option<String>,
    action: String,
    target: Option<String>,
    source_ip: Option<String>,
    request_id: Option<String>,
    outcome: String,
    status_code: Option<i32>,
    details: serde_json::Value,
}

impl From<AuditRow> for AuditEvent {
    fn from(row: AuditRow) -> AuditEvent {
        AuditEvent {
            id: row.id,
            occurred_at: row.occurred_at,
            team_id: row.team_id,
            actor_type: row.actor_type,
            actor_id: row.actor_id,
            action: row.action,
            target: row.target,
            source_ip: row.source_ip,
            request_id: row.request_id,
            outcome: row.outcome,
            status_code: row.status_code,
            details: row.details,
        }
    }
}

const AUDIT_COLUMNS: &str = "id, occurred_at, team_id, actor_type, actor_id, action, target, \
     source_ip, request_id, outcome, status_code, details";

/// The team's audit log, newest first. Needs the admin role.
#[utoipa::path(get, path = "/v1/audit", tag = "audit", security(("bearer" = [])),
    params(AuditQuery),
    responses((status = 200, description = "OK", body = AuditPage), (status = 403, description = "Role does not allow this (`forbidden`)", body = ErrorBody), (status = 422, description = "Invalid field (`invalid_request`)", body = ErrorBody)))]
async fn list_audit(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> ApiResult<Json<AuditPage>> {
    principal.require(Role::Admin)?;
    if let Some(outcome) = &query.outcome
        && !matches!(outcome.as_str(), "success" | "failure" | "denied")
    {
        return Err(ApiError::InvalidRequest(
            "`outcome` is one of success, failure, denied".to_owned(),
        ));
    }
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!(
            "`limit` must be between 1 and {MAX_LIMIT}"
        )));
    }
    let before_id: Option<i64> =
        match &query.cursor {
            Some(cursor) => Some(cursor.parse().ok().filter(|id: &i64| *id > 0).ok_or_else(
                || ApiError::InvalidRequest("`cursor` is not a valid cursor".to_owned()),
            )?),
            None => None,
        };
    let (action_exact, action_prefix) = match query.action.as_deref() {
        Some(action) => match action.strip_suffix('*') {
            Some(prefix) => (None, Some(format!("{}%", escape_like(prefix)))),
            None => (Some(action.to_owned()), None),
        },
        None => (None, None),
    };
    let rows: Vec<AuditRow> = sqlx::query_as(&format!(
        "SELECT {AUDIT_COLUMNS} FROM audit_events \
         WHERE team_id = $1 \
           AND ($2::timestamptz IS NULL OR occurred_at >= $2) \
           AND ($3::timestamptz IS NULL OR occurred_at < $3) \
           AND ($4::text IS NULL OR actor_id = $4) \
           AND ($5::text IS NULL OR action = $5) \
           AND ($6::text IS NULL OR action LIKE $6) \
           AND ($7::bigint IS NULL OR id < $7) \
           AND ($9::text IS NULL OR outcome = $9) \
         ORDER BY id DESC LIMIT $8"
    ))
    .bind(principal.team_id)
    .bind(query.from)
    .bind(query.to)
    .bind(&query.actor)
    .bind(action_exact)
    .bind(action_prefix)
    .bind(before_id)
    .bind(limit + 1)
    .bind(&query.outcome)
    .fetch_all(&state.db)
    .await?;
    let has_more = rows.len() as i64 > limit;
    let items: Vec<AuditEvent> = rows
        .into_iter()
        .take(limit as usize)
        .map(AuditEvent::from)
        .collect();
    let next_cursor = if has_more {
        items.last().map(|event| event.id.to_string())
    } else {
        None
    };
    Ok(Json(AuditPage { items, next_cursor }))
}

/// One audit event of the team. Needs the admin role.
#[utoipa::path(get, path = "/v1/audit/{id}", tag = "audit", security(("bearer" = [])),
    params(("id" = i64, Path)),
    responses((status = 200, description = "OK", body = AuditEvent), (status = 404, description = "Not found in the caller's team (`not_found`)", body = ErrorBody)))]
async fn get_audit_event(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<AuditEvent>> {
    principal.require(Role::Admin)?;
    let row: AuditRow = sqlx::query_as(&format!(
        "SELECT {AUDIT_COLUMNS} FROM audit_events WHERE id = $1 AND team_id = $2"
    ))
    .bind(id)
    .bind(principal.team_id)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("audit event"))?;
    Ok(Json(row.into()))
}

fn escape_like(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}
