//! The HTTP layer, and the only module that knows axum: router assembly, extractors
//! (`Principal`, `NodeToken`, `RequestContext`, JSON/query/path with API errors), the
//! request-id, metrics and audit layers, how errors are answered, the public API's handlers
//! (`api`) and the internal routes workers call (`internal`). Handlers extract, call the
//! domain, and map the answer.

pub mod api;
pub mod audit;
pub mod client_ip;
pub mod error;
pub mod extract;
pub mod internal;
pub mod ip_limit;
mod mcp;
pub mod mcp_backend;
pub mod metrics;
pub mod node_token;
pub mod preview;
pub mod principal;
pub mod request_id;
pub mod serve;
pub mod store;
pub mod web;
pub mod worker_answer;

use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, Method, Uri};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};

use crate::config::Settings;
use crate::state::AppState;

/// The public API's OpenAPI document as a gateway with `settings` serves it at
/// `/v1/openapi.json`, without starting one.
pub fn openapi_document(settings: &Settings) -> anyhow::Result<serde_json::Value> {
    Ok(Routes::new(settings)?.openapi)
}

/// The routers of the public API and of the operational routes, before they get their
/// state, and the OpenAPI document rendered from the same list.
pub struct Routes {
    api: Router<AppState>,
    operations: Router<AppState>,
    web: Option<Arc<web::WebAssets>>,
    pub openapi: serde_json::Value,
}

impl Routes {
    pub fn new(settings: &Settings) -> anyhow::Result<Routes> {
        let (api, operations) = api::api_router(settings);
        let (api, mut document) = api.split_for_parts();
        let (operations, operations_document) = operations.split_for_parts();
        document.merge(operations_document);
        let mut openapi =
            serde_json::to_value(&document).context("rendering the OpenAPI document")?;
        api::common_answers::document(&mut openapi);
        api::schema_rules::document(&mut openapi, settings);
        let web = match &settings.server.web_dir {
            Some(root) => Some(Arc::new(web::WebAssets::load(root)?)),
            None => None,
        };
        Ok(Routes {
            api,
            operations,
            web,
            openapi,
        })
    }

    /// The public listener's application: request id → the address's rate → preview hosts
    /// (served apart from the API) → body limit →
    /// metrics (route layer) → audit (route layer, API routes only) → handlers; and the API
    /// as the harness calls it in process (the same router, without `/mcp`).
    pub fn into_router(self, state: AppState) -> (Router, Arc<mcp_backend::InProcess>) {
        let body_limit = state.settings.server.body_limit_bytes;
        let web = self.web;
        let app = self
            .api
            .route_layer(from_fn_with_state(state.clone(), audit::middleware))
            .merge(self.operations)
            .merge(store::router())
            .route_layer(from_fn(metrics::middleware))
            .fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
                fallback(web.clone(), method, uri, headers)
            })
            .method_not_allowed_fallback(api::method_not_allowed)
            .with_state(state.clone());
        // MCP's tools and the harness call the API in process: the router as it is before
        // `/mcp` joins it.
        let in_process = app.clone().layer(DefaultBodyLimit::max(body_limit));
        let harness = Arc::new(mcp_backend::InProcess::new(
            in_process.clone(),
            state.clone(),
        ));
        let with_mcp = app.merge(mcp::router(in_process, state.clone()));
        let router = with_mcp
            .layer(DefaultBodyLimit::max(body_limit))
            .layer(from_fn_with_state(state.clone(), preview::middleware))
            .layer(from_fn_with_state(state, ip_limit::middleware))
            .layer(from_fn(request_id::middleware));
        (router, harness)
    }
}

/// The internal listener's application: what workers call (registration, heartbeats, usage
/// reports), the operator's template operations and `/metrics`.
pub fn internal_router(state: AppState) -> Router {
    let body_limit = state.settings.server.body_limit_bytes;
    // The store's routes too: sandboxes reach them from their node (their egress proxy
    // adds the sandbox's store credential).
    internal::router()
        .merge(store::router())
        .route("/metrics", axum::routing::get(api::health::metrics))
        .route_layer(from_fn(metrics::middleware))
        .fallback(api::fallback)
        .method_not_allowed_fallback(api::method_not_allowed)
        .with_state(state)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(from_fn(request_id::middleware))
}

/// What no route answers: the dashboard's paths (when it is served), else the API's 404.
async fn fallback(
    web: Option<Arc<web::WebAssets>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    match web {
        Some(web) if web::WebAssets::owns(&method, uri.path()) => {
            web.answer(&method, &uri, &headers)
        }
        _ => api::fallback(uri).await.into_response(),
    }
}
