//! The internal routes workers and the operator's tools call, authenticated by the node
//! token ([`super::node_token::NodeToken`]); outside the public API and its document.

mod recordings;
mod templates;
mod usage;
mod workers;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{post, put};
use sandbase_api::internal::paths;

use crate::state::AppState;

/// Largest usage report (16 MiB: ten thousand samples and events with room to spare).
const USAGE_REPORT_LIMIT: usize = 16 * 1024 * 1024;

pub fn router() -> Router<AppState> {
    Router::new()
        .route(paths::WORKER_REGISTER, post(workers::register))
        .route(paths::WORKER_HEARTBEAT, post(workers::heartbeat))
        .route(
            paths::USAGE,
            post(usage::report).layer(DefaultBodyLimit::max(USAGE_REPORT_LIMIT)),
        )
        .route(
            &paths::template("{name}"),
            put(templates::import).delete(templates::remove),
        )
        .route(&paths::template_pull("{name}"), post(templates::pull))
        .route(
            &paths::recording("{id}", "{chunk}"),
            put(recordings::chunk).layer(DefaultBodyLimit::max(
                crate::sandboxes::recordings::MAX_CHUNK,
            )),
        )
        .route(&paths::recording("{id}", ""), post(recordings::end))
        .route(
            &paths::recording_whole("{id}"),
            put(recordings::whole).layer(DefaultBodyLimit::max(
                crate::sandboxes::recordings::MAX_CHUNK,
            )),
        )
}
