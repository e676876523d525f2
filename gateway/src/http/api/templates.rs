//! The templates sandboxes can start from (the operator imports them on the workers).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Principal;
use crate::error::ApiResult;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_templates))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Template {
    pub name: String,
    /// Live workers that have it.
    pub workers: u32,
    /// Started sandboxes of it waiting in warm pools.
    pub warm: u32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateList {
    pub templates: Vec<Template>,
}

/// Templates on the live workers.
#[utoipa::path(get, path = "/v1/templates", tag = "sandboxes", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = TemplateList)))]
async fn list_templates(
    State(state): State<AppState>,
    _principal: Principal,
) -> ApiResult<Json<TemplateList>> {
    let mut templates: BTreeMap<String, Template> = BTreeMap::new();
    for worker in state.sandboxes.workers.live().await?.iter() {
        for info in &worker.templates {
            let entry = templates
                .entry(info.name.clone())
                .or_insert_with(|| Template {
                    name: info.name.clone(),
                    workers: 0,
                    warm: 0,
                });
            entry.workers += 1;
            entry.warm += info.warm;
        }
    }
    Ok(Json(TemplateList {
        templates: templates.into_values().collect(),
    }))
}
