//! The team's credits: balance with grants, and the ledger.

use axum::Json;
use axum::extract::State;
use sandbase_api::ErrorBody;
use sandbase_api::billing::{
    BalanceAnswer, GrantAnswer, LedgerEntry, LedgerPage, LedgerTransaction,
};
use sandbase_billing::Credits;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiQuery;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(balance))
        .routes(routes!(ledger))
}

/// Credits available now, and the grants they come from (in the order they are used).
#[utoipa::path(get, path = "/v1/billing/balance", tag = "billing", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = BalanceAnswer)))]
async fn balance(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<BalanceAnswer>> {
    let mut connection = state.db.acquire().await?;
    let balance = sandbase_billing::balance(&mut connection, principal.team_id).await?;
    Ok(Json(BalanceAnswer {
        available: balance.available.to_string(),
        available_micro: balance.available.0,
        grants: balance
            .grants
            .into_iter()
            .map(|grant| GrantAnswer {
                id: grant.id,
                source: grant.source,
                amount_micro: grant.amount,
                remaining_micro: grant.remaining,
                priority: grant.priority,
                effective_at: grant.effective_at,
                expires_at: grant.expires_at,
                expired: grant.expired,
            })
            .collect(),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct LedgerQuery {
    /// `next_cursor` of the previous page.
    before: Option<Uuid>,
    /// Page size, 1 to 200 (default 50).
    limit: Option<i64>,
}

/// The team's ledger transactions, newest first, each with its balanced entries.
#[utoipa::path(get, path = "/v1/billing/ledger", tag = "billing", security(("bearer" = [])),
    params(LedgerQuery),
    responses((status = 200, description = "OK", body = LedgerPage), (status = 422, description = "Invalid page size", body = ErrorBody)))]
async fn ledger(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<LedgerQuery>,
) -> ApiResult<Json<LedgerPage>> {
    let limit = query.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(ApiError::InvalidRequest(
            "`limit` must be between 1 and 200".to_owned(),
        ));
    }
    let mut connection = state.db.acquire().await?;
    let rows =
        sandbase_billing::transactions(&mut connection, principal.team_id, query.before, limit + 1)
            .await?;
    let more = rows.len() as i64 > limit;
    let transactions: Vec<LedgerTransaction> = rows
        .into_iter()
        .take(limit as usize)
        .map(|row| LedgerTransaction {
            id: row.id,
            kind: row.kind,
            description: row.description,
            amount: Credits(row.amount).to_string(),
            amount_micro: row.amount,
            created_at: row.created_at,
            entries: row
                .entries
                .into_iter()
                .map(|entry| LedgerEntry {
                    account: entry.account,
                    amount_micro: entry.amount,
                    grant_id: entry.grant_id,
                })
                .collect(),
        })
        .collect();
    Ok(Json(LedgerPage {
        next_cursor: more
            .then(|| transactions.last().map(|row| row.id))
            .flatten(),
        transactions,
    }))
}
