//! The operator's routes on the public API, authenticated by the node token (the operator's
//! credential) rather than a team's key.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{Duration, Utc};
use sandbase_api::ErrorBody;
use sandbase_api::billing::{AdminGrantAnswer, AdminGrantRequest};
use sandbase_billing::{Credits, GrantSource, NewGrant};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::node_token::Operator;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(grant))
}

/// Grant credits to a team (operator only: the node token). Idempotent with `idempotency_key`.
#[utoipa::path(post, path = "/v1/admin/teams/{id}/grants", tag = "admin", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Team id")),
    request_body = AdminGrantRequest,
    responses(
        (status = 201, description = "Granted (or already granted with this key: `granted: false`)", body = AdminGrantAnswer),
        (status = 401, description = "Not the operator's token (`invalid_operator_token`)", body = ErrorBody),
        (status = 404, description = "No such team", body = ErrorBody),
        (status = 422, description = "Invalid amount or field", body = ErrorBody),
    ))]
async fn grant(
    State(state): State<AppState>,
    _operator: Operator,
    ApiPath(team_id): ApiPath<Uuid>,
    ApiJson(request): ApiJson<AdminGrantRequest>,
) -> ApiResult<(StatusCode, Json<AdminGrantAnswer>)> {
    let amount = Credits::parse(&request.credits)
        .filter(|amount| amount.0 > 0)
        .ok_or_else(|| {
            ApiError::InvalidRequest(
                "`credits` must be a positive amount with at most 6 decimals".to_owned(),
            )
        })?;
    let key = match request.idempotency_key {
        Some(key) if key.is_empty() || key.len() > 200 => {
            return Err(ApiError::InvalidRequest(
                "`idempotency_key`: 1 to 200 characters".to_owned(),
            ));
        }
        Some(key) => format!("admin:{team_id}:{key}"),
        None => format!("admin:{}", Uuid::now_v7()),
    };
    let note = request.note.unwrap_or_else(|| "admin grant".to_owned());
    if note.len() > 500 {
        return Err(ApiError::InvalidRequest(
            "`note`: at most 500 characters".to_owned(),
        ));
    }
    if request.expires_in_days == Some(0) {
        return Err(ApiError::InvalidRequest(
            "`expires_in_days` must be at least 1 (absent: never)".to_owned(),
        ));
    }
    let mut transaction = state.db.begin().await?;
    let team: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM teams WHERE id = $1")
        .bind(team_id)
        .fetch_optional(&mut *transaction)
        .await?;
    if team.is_none() {
        return Err(ApiError::NotFound("team"));
    }
    let granted = sandbase_billing::grant(
        &mut transaction,
        NewGrant {
            team_id,
            source: GrantSource::Admin,
            amount,
            priority: request.priority.unwrap_or(10),
            effective_at: None,
            expires_at: request
                .expires_in_days
                .map(|days| Utc::now() + Duration::days(i64::from(days))),
            idempotency_key: key,
            description: note.clone(),
            details: serde_json::json!({ "by": "POST /v1/admin/teams/{id}/grants" }),
        },
    )
    .await?;
    if let Some(grant_id) = granted {
        crate::audit::insert(
            &mut transaction,
            &crate::audit::Entry {
                team_id: Some(team_id),
                actor_type: "system",
                actor_id: None,
                action: "billing.admin_grant".to_owned(),
                target: Some(format!("grant:{grant_id}")),
                outcome: "success",
                status_code: Some(201),
                details: serde_json::json!({ "amount_micro": amount.0, "note": note, "by": "operator" }),
            },
            None,
            None,
        )
        .await?;
    }
    transaction.commit().await?;
    // Admissions read the new balance from the ledger.
    let _ = state.billing.admission.forget(team_id).await;
    Ok((
        StatusCode::CREATED,
        Json(AdminGrantAnswer {
            grant_id: granted,
            credits: amount.to_string(),
            amount_micro: amount.0,
            granted: granted.is_some(),
        }),
    ))
}
