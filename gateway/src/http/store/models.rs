//! `GET /openai/v1/models` and `GET /anthropic/v1/models`: the store's models of the family,
//! in the family's list shape.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::caller::caller;
use super::errors::StoreError;
use crate::http::client_ip::ClientIp;
use crate::state::AppState;
use crate::store::Family;

async fn listed(
    state: &AppState,
    headers: &HeaderMap,
    ip: ClientIp,
    family: Family,
) -> Result<(), StoreError> {
    caller(state, headers, ip.0)
        .await
        .map_err(|error| StoreError::new(family, error))?;
    Ok(())
}

pub async fn openai(
    State(state): State<AppState>,
    ip: ClientIp,
    headers: HeaderMap,
) -> Result<Json<Value>, StoreError> {
    listed(&state, &headers, ip, Family::Openai).await?;
    let data: Vec<Value> = state
        .store
        .models()
        .iter()
        // Anthropic's models too: chat completions reach them through translation.
        .map(|model| {
            json!({
                "id": model.settings.id,
                "object": "model",
                "created": 0,
                "owned_by": model.settings.provider,
            })
        })
        .collect();
    Ok(Json(json!({ "object": "list", "data": data })))
}

pub async fn anthropic(
    State(state): State<AppState>,
    ip: ClientIp,
    headers: HeaderMap,
) -> Result<Json<Value>, StoreError> {
    listed(&state, &headers, ip, Family::Anthropic).await?;
    // OpenAI's models too: messages reach them through translation.
    let data: Vec<Value> = state
        .store
        .models()
        .iter()
        .map(|model| {
            json!({
                "type": "model",
                "id": model.settings.id,
                "display_name": model.settings.id,
                "created_at": "1970-01-01T00:00:00Z",
            })
        })
        .collect();
    let first = data.first().map(|model| model["id"].clone());
    let last = data.last().map(|model| model["id"].clone());
    Ok(Json(
        json!({ "data": data, "has_more": false, "first_id": first, "last_id": last }),
    ))
}
