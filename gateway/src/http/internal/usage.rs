//! Usage reports from the workers: answered only once written to PostgreSQL.

use axum::Json;
use axum::extract::State;
use sandbase_api::internal::{UsageReceipt, UsageReport};

use crate::error::ApiResult;
use crate::http::extract::ApiJson;
use crate::http::node_token::WorkerIdentity;
use crate::state::AppState;

pub async fn report(
    State(state): State<AppState>,
    worker: WorkerIdentity,
    ApiJson(report): ApiJson<UsageReport>,
) -> ApiResult<Json<UsageReceipt>> {
    worker.speaks_for(&report.worker)?;
    Ok(Json(
        crate::usage::ingest::ingest(&state.db, &state.settings.billing, &report).await?,
    ))
}
