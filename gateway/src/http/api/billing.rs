//! The team's credits: balance with grants, the ledger, buying credits with Stripe.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use sandbase_api::billing::{
    BalanceAnswer, CheckoutAnswer, CheckoutRequest, GrantAnswer, LedgerEntry, LedgerPage,
    LedgerTransaction,
};
use sandbase_api::{ErrorBody, Role};
use sandbase_billing::Credits;
use secrecy::ExposeSecret;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::state::AppState;
use crate::stripe::Stripe;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(balance))
        .routes(routes!(ledger))
        .routes(routes!(checkout))
        .routes(routes!(stripe_webhook))
}

/// Buy credits: a Stripe Checkout Session for `credits`, whose URL the buyer opens. The
/// credits are granted when Stripe reports the payment (webhook), once.
#[utoipa::path(post, path = "/v1/billing/checkout", tag = "billing", security(("bearer" = [])),
    request_body = CheckoutRequest,
    responses(
        (status = 201, description = "Session created", body = CheckoutAnswer),
        (status = 422, description = "Credits out of range", body = ErrorBody),
        (status = 501, description = "Stripe is not configured here (`billing_not_configured`)", body = ErrorBody),
        (status = 502, description = "Stripe refused or did not answer (`stripe_error`)", body = ErrorBody),
    ))]
async fn checkout(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(request): ApiJson<CheckoutRequest>,
) -> ApiResult<(StatusCode, Json<CheckoutAnswer>)> {
    let audit = context.action("billing.checkout");
    principal.require(Role::Admin)?;
    let settings = &state.settings.stripe;
    if settings.secret_key.is_none() {
        return Err(ApiError::BillingNotConfigured(
            "buying credits is not set up on this deployment (stripe.secret_key); ask an operator for a grant",
        ));
    }
    if request.credits < settings.min_credits || request.credits > settings.max_credits {
        return Err(ApiError::InvalidRequest(format!(
            "`credits` must be between {} and {}",
            settings.min_credits, settings.max_credits
        )));
    }
    let stripe = Stripe {
        http: &state.billing.http,
        settings,
    };
    let team_name: String = sqlx::query_scalar("SELECT name FROM teams WHERE id = $1")
        .bind(principal.team_id)
        .fetch_one(&state.db)
        .await?;
    let stripe_error = |error: anyhow::Error| {
        tracing::warn!(error = format!("{error:#}"), "a Stripe call failed");
        ApiError::StripeError
    };
    let customer = stripe
        .customer(&state.db, principal.team_id, &team_name)
        .await
        .map_err(stripe_error)?;
    let (session_id, url) = stripe
        .checkout(
            &customer,
            principal.team_id,
            request.credits,
            &format!("sandbase-checkout-{}", Uuid::now_v7()),
        )
        .await
        .map_err(stripe_error)?;
    let mut transaction = state.db.begin().await?;
    sqlx::query(
        "INSERT INTO stripe_sessions (id, team_id, credits, amount_cents) VALUES ($1, $2, $3, $4)",
    )
    .bind(&session_id)
    .bind(principal.team_id)
    .bind(request.credits as i64)
    .bind((request.credits * settings.unit_amount) as i64)
    .execute(&mut *transaction)
    .await?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("stripe_session:{session_id}")),
            serde_json::json!({ "credits": request.credits }),
        )
        .await?;
    transaction.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(CheckoutAnswer { url, session_id }),
    ))
}

/// Stripe's webhook (signed with `Stripe-Signature`): grants paid checkouts once, takes
/// back refunds. Events are deduplicated by id.
#[utoipa::path(post, path = "/v1/billing/stripe/webhook", tag = "billing",
    request_body(content = String, content_type = "application/json"),
    responses(
        (status = 200, description = "Received (also for duplicates and ignored types)"),
        (status = 400, description = "Bad or old signature (`invalid_signature`), or not an event", body = ErrorBody),
        (status = 501, description = "No webhook secret configured", body = ErrorBody),
    ))]
async fn stripe_webhook(
    State(state): State<AppState>,
    context: RequestContext,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    context.action("billing.stripe_webhook");
    let settings = &state.settings.stripe;
    let Some(secret) = &settings.webhook_secret else {
        return Err(ApiError::BillingNotConfigured(
            "no Stripe webhook secret is configured (stripe.webhook_secret)",
        ));
    };
    let header = headers
        .get("stripe-signature")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if let Err(error) = crate::stripe::verify_signature(
        header,
        &body,
        secret.expose_secret(),
        chrono::Utc::now().timestamp(),
        settings.tolerance_secs,
    ) {
        tracing::warn!(?error, "a Stripe webhook was refused");
        return Err(ApiError::InvalidSignature);
    }
    let event: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|_| ApiError::InvalidJson("the event is not JSON".to_owned()))?;
    let (Some(id), Some(kind)) = (event["id"].as_str(), event["type"].as_str()) else {
        return Err(ApiError::InvalidRequest(
            "an event has an id and a type".to_owned(),
        ));
    };
    let mut transaction = state.db.begin().await?;
    // A concurrent delivery of the same event waits here for the first to commit.
    let fresh = sqlx::query(
        "INSERT INTO stripe_events (id, type, outcome) VALUES ($1, $2, 'pending') ON CONFLICT (id) DO NOTHING",
    )
    .bind(id)
    .bind(kind)
    .execute(&mut *transaction)
    .await?;
    if fresh.rows_affected() == 0 {
        return Ok(Json(
            serde_json::json!({ "received": true, "duplicate": true }),
        ));
    }
    let (outcome, team) = crate::stripe::handle_event(&mut transaction, &event, settings).await?;
    sqlx::query("UPDATE stripe_events SET outcome = $2 WHERE id = $1")
        .bind(id)
        .bind(outcome)
        .execute(&mut *transaction)
        .await?;
    transaction.commit().await?;
    // Balances changed: the admission cache reads the ledger again.
    if let Some(team) = team {
        let _ = state.billing.admission.forget(team).await;
    }
    tracing::info!(event = id, kind, outcome, "Stripe event handled");
    Ok(Json(
        serde_json::json!({ "received": true, "outcome": outcome }),
    ))
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
    let reserved = state
        .billing
        .admission
        .reserved(principal.team_id)
        .await
        .map_err(|error| ApiError::Unavailable(format!("credit admission: {error:#}")))?;
    Ok(Json(BalanceAnswer {
        available: balance.available.to_string(),
        available_micro: balance.available.0,
        reserved: Credits(reserved).to_string(),
        reserved_micro: reserved,
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
    #[param(minimum = 1, maximum = 200)]
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
