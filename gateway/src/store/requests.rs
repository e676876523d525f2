//! The team's record of its store calls (`store_requests`), read back.

use chrono::{DateTime, Utc};
use sandbase_api::store::{StoreRequest, TokenCounts};
use sandbase_billing::Credits;
use uuid::Uuid;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    kind: String,
    name: String,
    endpoint: String,
    streamed: bool,
    status: i32,
    input_tokens: i64,
    cached_input_tokens: i64,
    cache_write_tokens: i64,
    output_tokens: i64,
    cost_micro: i64,
    estimated: bool,
    latency_ms: i64,
    first_byte_ms: Option<i64>,
    api_key_id: Option<Uuid>,
    created_at: DateTime<Utc>,
}

impl Row {
    fn to_api(&self) -> StoreRequest {
        StoreRequest {
            id: self.id,
            kind: self.kind.clone(),
            name: self.name.clone(),
            endpoint: self.endpoint.clone(),
            streamed: self.streamed,
            status: self.status,
            tokens: TokenCounts {
                input: self.input_tokens,
                cached_input: self.cached_input_tokens,
                cache_write: self.cache_write_tokens,
                output: self.output_tokens,
            },
            credits: Credits(self.cost_micro).to_string(),
            credits_micro: self.cost_micro,
            estimated: self.estimated,
            latency_ms: self.latency_ms,
            first_byte_ms: self.first_byte_ms,
            api_key_id: self.api_key_id,
            created_at: self.created_at,
        }
    }
}

const COLUMNS: &str = "id, kind, name, endpoint, streamed, status, input_tokens, cached_input_tokens, \
     cache_write_tokens, output_tokens, cost_micro, estimated, latency_ms, first_byte_ms, api_key_id, created_at";

/// One call of the team (404 for another team's).
pub async fn get(state: &AppState, team_id: Uuid, id: Uuid) -> ApiResult<StoreRequest> {
    let row: Option<Row> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM store_requests WHERE id = $1 AND team_id = $2"
    ))
    .bind(id)
    .bind(team_id)
    .fetch_optional(&state.db)
    .await?;
    row.map(|row| row.to_api())
        .ok_or(ApiError::NotFound("store request"))
}

/// The team's calls, newest first (before `before`, when given).
pub async fn list(
    state: &AppState,
    team_id: Uuid,
    before: Option<DateTime<Utc>>,
    limit: i64,
) -> ApiResult<Vec<StoreRequest>> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM store_requests WHERE team_id = $1 AND ($2::timestamptz IS NULL OR created_at < $2) \
         ORDER BY created_at DESC LIMIT $3"
    ))
    .bind(team_id)
    .bind(before)
    .bind(limit)
    .fetch_all(&state.db)
    .await?;
    Ok(rows.iter().map(Row::to_api).collect())
}
