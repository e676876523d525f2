//! `GET` and `PATCH /v1/team/settings`: what the team decides for all its members (today
//! whether members' keystrokes are recorded in their terminal sessions).

use axum::Json;
use axum::extract::State;
use sandbase_api::{ErrorBody, Role, TeamSettings, UpdateTeamSettings};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::http::extract::ApiJson;
use crate::state::AppState;
use crate::teams;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_settings, update_settings))
}

/// The team's settings.
#[utoipa::path(get, path = "/v1/team/settings", tag = "team", security(("bearer" = [])),
    responses(
        (status = 200, description = "OK", body = TeamSettings),
    ))]
async fn get_settings(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<TeamSettings>> {
    Ok(Json(teams::settings(&state.db, principal.team_id).await?))
}

/// Change the team's settings (admins and owners; audited with what changed). A setting
/// applies to what is opened after the change.
#[utoipa::path(patch, path = "/v1/team/settings", tag = "team", security(("bearer" = [])),
    request_body = UpdateTeamSettings,
    responses(
        (status = 200, description = "The settings as they now are", body = TeamSettings),
        (status = 403, description = "Not an admin (`forbidden`)", body = ErrorBody),
    ))]
async fn update_settings(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiJson(change): ApiJson<UpdateTeamSettings>,
) -> ApiResult<Json<TeamSettings>> {
    let audit = context.action("team.settings.update");
    principal.require(Role::Admin)?;
    let mut transaction = state.db.begin().await?;
    let settings = teams::update_settings(&mut transaction, principal.team_id, &change).await?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("team:{}", principal.team_id)),
            serde_json::to_value(&change).unwrap_or_default(),
        )
        .await?;
    transaction.commit().await?;
    Ok(Json(settings))
}
