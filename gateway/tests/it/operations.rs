use reqwest::Method;

use crate::helpers::{email, spawn_app, spawn_app_with};

#[tokio::test]
async fn health_readiness_and_metrics() {
    let app = spawn_app().await;
    let health = app.request(Method::GET, "/healthz", None, None).await;
    assert_eq!(
        (health.status.as_u16(), health.body["status"].as_str()),
        (200, Some("ok"))
    );
    let ready = app.request(Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.body["postgres"], "ok");
    assert_eq!(ready.body["redis"], "ok");

    app.signup(&email("metrics"), "Metrics").await;
    // Metrics are on the internal listener only.
    let public = app.request(Method::GET, "/metrics", None, None).await;
    assert_eq!(public.status, 404);
    let response = app
        .internal_http
        .get(format!("{}/metrics", app.internal))
        .send()
        .await
        .unwrap();
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = response.text().await.unwrap();
    assert!(
        text.lines()
            .any(|line| line.starts_with("sandbase_http_requests_total{")
                && line.contains("route=\"/v1/auth/signup\"")
                && line.contains("status=\"201\"")),
        "{text}"
    );
    assert!(text.contains("sandbase_http_request_duration_seconds_bucket{"));
}

#[tokio::test]
async fn readiness_fails_when_redis_is_unreachable() {
    // A gateway whose Redis goes away: build succeeds while it is up, so point a second
    // gateway at a port nobody listens on and expect start-up to fail with the key named.
    let mut settings = sandbase_gateway::testing::settings().await;
    settings.redis.url = Some(secrecy::SecretString::from("redis://127.0.0.1:1"));
    let error = match sandbase_gateway::Application::build(settings).await {
        Ok(_) => panic!("started without Redis"),
        Err(error) => format!("{error:#}"),
    };
    assert!(error.contains("redis.url"), "{error}");
}

#[tokio::test]
async fn request_ids_are_echoed_or_generated() {
    let app = spawn_app_with(|_| {}).await;
    let response = app
        .http
        .get(format!("{}/v1/me", app.address))
        .header("x-request-id", "trace-abc.123")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "trace-abc.123");
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["request_id"], "trace-abc.123");

    // A hostile id (too long, odd characters) is replaced, not echoed.
    let response = app
        .http
        .get(format!("{}/healthz", app.address))
        .header("x-request-id", "x".repeat(500))
        .send()
        .await
        .unwrap();
    let id = response.headers()["x-request-id"].to_str().unwrap();
    assert_eq!(id.len(), 36, "{id}");
}
