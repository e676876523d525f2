//! `GET /v1/me`: who the caller is.

use axum::Json;
use axum::extract::State;
use chrono::Utc;
use sandbase_api::{AuthKind, ErrorBody, Me};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::accounts;
use crate::auth::{Actor, Principal};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(me))
}

/// The caller's team and role, and the key or user behind the credentials.
///
/// For an API key this is answered from the gateway's key cache, without a database
/// round trip.
#[utoipa::path(get, path = "/v1/me", tag = "auth", security(("bearer" = [])),
    responses(
        (status = 200, description = "OK", body = Me),
        (status = 401, description = "Missing, invalid, revoked or expired credentials", body = ErrorBody),
        (status = 429, description = "Rate limited (`rate_limited`, with Retry-After)", body = ErrorBody),
    ))]
async fn me(State(state): State<AppState>, principal: Principal) -> ApiResult<Json<Me>> {
    match &principal.actor {
        Actor::ApiKey(record) => Ok(Json(Me {
            team: record.team.clone(),
            role: principal.role,
            auth: AuthKind::ApiKey,
            user: record.creator.clone(),
            // This very request is the key's latest use.
            api_key: Some(record.to_api(Some(Utc::now()))),
        })),
        Actor::User { id } => {
            let mut connection = state.db.acquire().await?;
            let team = accounts::find_team(&mut connection, principal.team_id)
                .await?
                .ok_or(ApiError::NotFound("team"))?;
            let user = accounts::find_user(&mut connection, *id).await?;
            Ok(Json(Me {
                team: team.into(),
                role: principal.role,
                auth: AuthKind::Session,
                user: user.map(|user| user.to_api()),
                api_key: None,
            }))
        }
    }
}
