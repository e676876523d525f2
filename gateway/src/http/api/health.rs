//! Liveness and readiness (public), and the metrics the internal listener serves.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use sandbase_api::{Health, Readiness};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::AppState;

const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// Liveness: the process is up and serving.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "OK", body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

/// Readiness: Postgres and Redis answer. 503 when either does not.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "OK", body = Readiness), (status = 503, description = "Not ready", body = Readiness)))]
async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let postgres =
        tokio::time::timeout(CHECK_TIMEOUT, sqlx::query("SELECT 1").execute(&state.db)).await;
    let postgres = match postgres {
        Ok(Ok(_)) => "ok".to_owned(),
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "readiness: postgres check failed");
            "error".to_owned()
        }
        Err(_) => "timeout".to_owned(),
    };
    let mut redis = state.redis.clone();
    let redis = tokio::time::timeout(
        CHECK_TIMEOUT,
        redis::cmd("PING").query_async::<String>(&mut redis),
    )
    .await;
    let redis = match redis {
        Ok(Ok(_)) => "ok".to_owned(),
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "readiness: redis check failed");
            "error".to_owned()
        }
        Err(_) => "timeout".to_owned(),
    };
    let draining = state.draining.load(std::sync::atomic::Ordering::SeqCst);
    let ready = postgres == "ok" && redis == "ok" && !draining;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let label = match (ready, draining) {
        (true, _) => "ok",
        (false, true) => "draining",
        (false, false) => "unavailable",
    };
    (
        status,
        Json(Readiness {
            status: label.to_owned(),
            postgres,
            redis,
        }),
    )
}

/// Prometheus metrics in the text exposition format (internal listener only).
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    state.metrics.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
