//! What the team spent, grouped for a chart: by hour or day, sandbox, kind or API key.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Duration, Utc};
use sandbase_api::ErrorBody;
use sandbase_api::billing::{UsageAnswer, UsagePoint};
use sandbase_billing::Credits;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::ApiQuery;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(usage))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct UsageQuery {
    /// Start (RFC 3339; default: 7 days ago).
    from: Option<DateTime<Utc>>,
    /// End (RFC 3339; default: now).
    to: Option<DateTime<Utc>>,
    /// `hour`, `day` (default), `sandbox`, `kind`, `key` or `model`.
    #[param(pattern = "^(hour|day|sandbox|kind|key|model)$")]
    group_by: Option<String>,
    /// A second grouping inside each group, for stacked charts: `sandbox`, `kind`, `key`
    /// or `model` (each point then names its `split`).
    #[param(pattern = "^(sandbox|kind|key|model)$")]
    split_by: Option<String>,
}

/// The SQL expression of a grouping, over the debit `t` and its sandbox `s`.
fn expression(name: &str) -> Option<&'static str> {
    Some(match name {
        "hour" => {
            "to_char(date_trunc('hour', t.created_at AT TIME ZONE 'UTC'), 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"')"
        }
        "day" => "to_char(date_trunc('day', t.created_at AT TIME ZONE 'UTC'), 'YYYY-MM-DD')",
        "sandbox" => "coalesce(t.details->>'sandbox', 'none')",
        "kind" => "coalesce(t.details->>'kind', t.description)",
        "key" => "coalesce(t.details->>'key', s.api_key_id::text, 'none')",
        "model" => "coalesce(t.details->>'model', 'none')",
        _ => return None,
    })
}

/// Credits charged to the team (grants and expiries not counted), grouped for a chart.
#[utoipa::path(get, path = "/v1/usage", tag = "billing", security(("bearer" = [])),
    params(UsageQuery),
    responses((status = 200, description = "OK", body = UsageAnswer), (status = 422, description = "Invalid grouping or range", body = ErrorBody)))]
async fn usage(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> ApiResult<Json<UsageAnswer>> {
    let to = query.to.unwrap_or_else(Utc::now);
    let from = query.from.unwrap_or(to - Duration::days(7));
    if from >= to || to - from > Duration::days(400) {
        return Err(ApiError::InvalidRequest(
            "`from` must be before `to`, at most 400 days apart".to_owned(),
        ));
    }
    let group_by = query.group_by.unwrap_or_else(|| "day".to_owned());
    let group = expression(&group_by).ok_or_else(|| {
        ApiError::InvalidRequest(
            "`group_by` is one of hour, day, sandbox, kind, key, model".to_owned(),
        )
    })?;
    let split = match query.split_by.as_deref() {
        None => "NULL::text",
        Some(name) if !matches!(name, "hour" | "day") && name != group_by => expression(name)
            .ok_or_else(|| {
                ApiError::InvalidRequest(
                    "`split_by` is one of sandbox, kind, key, model".to_owned(),
                )
            })?,
        Some(_) => {
            return Err(ApiError::InvalidRequest(
                "`split_by` is one of sandbox, kind, key, model, and not the `group_by`".to_owned(),
            ));
        }
    };
    let order = if matches!(group_by.as_str(), "hour" | "day") {
        "1, 3 DESC"
    } else {
        "3 DESC"
    };
    let rows: Vec<(String, Option<String>, i64)> = sqlx::query_as(&format!(
        "SELECT {group}, {split}, (-sum(e.amount))::bigint FROM ledger_transactions t \
         JOIN ledger_entries e ON e.transaction_id = t.id AND e.account = $2 \
         LEFT JOIN sandboxes s ON s.id::text = t.details->>'sandbox' AND s.team_id = t.team_id \
         WHERE t.team_id = $1 AND t.kind = 'debit' AND t.created_at >= $3 AND t.created_at < $4 \
         GROUP BY 1, 2 ORDER BY {order} LIMIT 10000"
    ))
    .bind(principal.team_id)
    .bind(format!("team:{}", principal.team_id))
    .bind(from)
    .bind(to)
    .fetch_all(&state.db)
    .await?;
    let total: i64 = rows.iter().map(|(_, _, amount)| amount).sum();
    Ok(Json(UsageAnswer {
        group_by,
        from,
        to,
        series: rows
            .into_iter()
            .map(|(key, split, amount)| UsagePoint {
                key,
                split,
                amount: Credits(amount).to_string(),
                amount_micro: amount,
            })
            .collect(),
        total: Credits(total).to_string(),
        total_micro: total,
    }))
}
