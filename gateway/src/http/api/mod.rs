//! The public API's handlers: every route is registered through `OpenApiRouter`, so the
//! served OpenAPI document and the router are built from the same list and cannot drift.

mod admin;
mod agent_runs;
mod api_keys;
mod audit;
mod auth;
mod billing;
mod code;
pub mod common_answers;
mod egress;
mod execs;
pub mod health;
mod me;
mod members;
mod previews;
mod recordings;
mod runs;
mod sandbox_pause;
mod sandboxes;
pub mod schema_rules;
mod secrets;
mod snapshots;
mod store;
mod team_settings;
mod templates;
mod terminals;
mod usage;

use axum::Json;
use axum::http::Uri;
use utoipa::openapi::OpenApi as OpenApiDocument;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "SandBase API",
        description = "Sandboxes, runs, credentials and credits for AI agents. Authenticate with \
                       `Authorization: Bearer <API key or session token>`. Errors are \
                       `{\"error\":{\"code\":\"…\",\"message\":\"…\"}}` with a stable code.",
        license(name = "MIT", identifier = "MIT")
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "auth", description = "Sign-up, login, and who the caller is"),
        (name = "api-keys", description = "API keys of the caller's team"),
        (name = "team", description = "Members, roles and the team's settings"),
        (name = "audit", description = "The append-only audit log"),
        (name = "sandboxes", description = "Sandboxes: lifecycle, commands, background processes"),
        (name = "files", description = "Files and archives inside a sandbox"),
        (name = "code", description = "Python in stateful contexts of a sandbox, with rich results"),
        (name = "billing", description = "Credits: balance, grants, ledger"),
        (name = "admin", description = "Operator routes (the node token)"),
        (name = "secrets", description = "Credentials in the vault (values never come out)"),
        (name = "runs", description = "One-shot runs: inputs in, command, artifacts out"),
        (name = "store", description = "Models through the store: prices and the record of each call"),
        (name = "operations", description = "Health, readiness, metrics, this document"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApiDocument) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The API routes (behind the audit layer) and the operational ones, with their document.
pub fn api_router(
    settings: &crate::config::Settings,
) -> (OpenApiRouter<AppState>, OpenApiRouter<AppState>) {
    let api = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(auth::router())
        .merge(me::router())
        .merge(api_keys::router())
        .merge(members::router())
        .merge(team_settings::router())
        .merge(audit::router())
        .merge(sandboxes::router())
        .merge(execs::router())
        .merge(code::router())
        .merge(sandbox_pause::router())
        .merge(previews::router())
        .merge(snapshots::router())
        .merge(terminals::router())
        .merge(recordings::router())
        .merge(templates::router())
        .merge(billing::router())
        .merge(usage::router())
        .merge(store::router())
        .merge(admin::router())
        .merge(secrets::router())
        .merge(egress::router())
        .merge(runs::router(settings.runs.input_limit_bytes))
        .merge(agent_runs::router());
    let operations = OpenApiRouter::new()
        .merge(health::router())
        .routes(routes!(openapi_document));
    (api, operations)
}

/// The OpenAPI 3.1 document of this API, generated from the handlers.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "operations",
    responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json")))]
async fn openapi_document(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> Json<serde_json::Value> {
    Json(state.openapi.as_ref().clone())
}

pub async fn fallback(uri: Uri) -> ApiError {
    ApiError::RouteNotFound(uri.path().to_owned())
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
