//! The store's own view: its models and prices, and the team's calls (the provider-shaped
//! routes themselves are in `http/store`).

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use sandbase_api::ErrorBody;
use sandbase_api::store::{
    StoreApi, StoreApiList, StoreModel, StoreModelList, StoreRequest, StoreRequestList, TokenPrices,
};
use sandbase_billing::Credits;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiPath, ApiQuery};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(models))
        .routes(routes!(apis))
        .routes(routes!(list_requests))
        .routes(routes!(get_request))
}

/// The models the store offers, with their prices in credits per million tokens.
#[utoipa::path(get, path = "/v1/store/models", tag = "store", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = StoreModelList), (status = 401, description = "Not authenticated", body = ErrorBody)))]
async fn models(State(state): State<AppState>, _principal: Principal) -> Json<StoreModelList> {
    let price = |micro: i64| Credits(micro).to_string();
    let models = state
        .store
        .models()
        .iter()
        .map(|model| StoreModel {
            id: model.settings.id.clone(),
            family: model.family.to_owned(),
            context_window: model.settings.context_window,
            max_output: model.settings.max_output,
            prices: TokenPrices {
                input: price(model.prices.input),
                cached_input: price(model.prices.cached_input),
                cache_write: price(model.prices.cache_write),
                output: price(model.prices.output),
            },
        })
        .collect();
    Json(StoreModelList { models })
}

/// The paid APIs the store offers (call them at `/store/apis/{name}/…`), with their prices.
#[utoipa::path(get, path = "/v1/store/apis", tag = "store", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = StoreApiList), (status = 401, description = "Not authenticated", body = ErrorBody)))]
async fn apis(State(state): State<AppState>, _principal: Principal) -> Json<StoreApiList> {
    let apis = state
        .store
        .apis()
        .iter()
        .map(|api| StoreApi {
            name: api.settings.name.clone(),
            price_per_call: Credits(api.per_call).to_string(),
            price_per_mib: Credits(api.per_mib).to_string(),
            max_response_bytes: api.settings.max_response_bytes,
        })
        .collect();
    Json(StoreApiList { apis })
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// At most this many (1–500, default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
    /// Only calls made before this time (RFC 3339), to page back.
    before: Option<DateTime<Utc>>,
}

/// The team's calls to the store, newest first.
#[utoipa::path(get, path = "/v1/store/requests", tag = "store", security(("bearer" = [])),
    params(ListQuery),
    responses((status = 200, description = "OK", body = StoreRequestList), (status = 422, description = "`limit` out of range", body = ErrorBody)))]
async fn list_requests(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> ApiResult<Json<StoreRequestList>> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::InvalidRequest(
            "`limit` must be between 1 and 500".to_owned(),
        ));
    }
    let requests =
        crate::store::requests::list(&state, principal.team_id, query.before, limit).await?;
    Ok(Json(StoreRequestList { requests }))
}

/// One call to the store: model, tokens by kind, credits, latency, status (the id is the
/// `x-sandbase-store-request` header of its answer).
#[utoipa::path(get, path = "/v1/store/requests/{id}", tag = "store", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The store request's id")),
    responses((status = 200, description = "OK", body = StoreRequest), (status = 404, description = "Not a call of the caller's team", body = ErrorBody)))]
async fn get_request(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<StoreRequest>> {
    Ok(Json(
        crate::store::requests::get(&state, principal.team_id, id).await?,
    ))
}
