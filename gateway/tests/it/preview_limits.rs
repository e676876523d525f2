//! What previews may hold of a gateway, since anyone may reach a public one: connections
//! bounded per port (and per sandbox and gateway), idle WebSockets closed, and a preview's
//! token guessed no faster than a key.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use sandbase_worker::service::TemplateSource;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::previews::{
    ECHO_SERVER, gateway_addr, host, open, preview_app_with, preview_client, serve, url,
};
use crate::testbed::{TestSandbox, TestWorker, wait_until, worker_config};

/// A public preview lets anyone in, so what its connections may hold is bounded: beyond the
/// preview's share a request is refused at once (503 `preview_busy`) while the others keep
/// working, a WebSocket nobody speaks on is closed after the idle timeout, and its place
/// comes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_public_preview_holds_a_bounded_number_of_connections_and_drops_idle_ones() {
    let app = preview_app_with(|settings| {
        settings.previews.max_connections_per_preview = 2;
        settings.previews.idle_timeout_secs = 2;
        settings.auth.failed_auth_per_minute = 5;
    })
    .await;
    let mut config = worker_config(&app, "pb", 2, 0);
    let tarball = std::env::var("SANDBASE_BASE_TARBALL").expect("SANDBASE_BASE_TARBALL");
    config
        .templates
        .push(("base".to_owned(), TemplateSource::Tarball(tarball.into())));
    let worker = TestWorker::start(config).await;
    let owner = app.signup("budget@example.com", "Budget").await;
    let sandbox =
        TestSandbox::create(&app, &owner.api_key.token, json!({ "template": "base" })).await;
    let opened = open(&sandbox, json!({ "port": 8001, "public": true })).await;
    let token = opened["token"].as_str().unwrap().to_owned();
    sandbox
        .put_file("/work/echo.py", ECHO_SERVER.as_bytes().to_vec())
        .await;
    serve(&sandbox, "exec python3 /work/echo.py 8001", 8001, &token).await;
    let connect = || async {
        let request = format!(
            "ws://{}:{}/ws",
            host(8001, &sandbox.id),
            gateway_addr(&app).port()
        )
        .into_client_request()
        .unwrap();
        let stream = tokio::net::TcpStream::connect(gateway_addr(&app))
            .await
            .unwrap();
        tokio_tungstenite::client_async(request, stream).await
    };
    let (mut first, _) = connect().await.unwrap();
    let (_second, _) = connect().await.unwrap();
    // An anonymous client asking for a third is refused at once; the first still works.
    let client = preview_client(&app, &[host(8001, &sandbox.id)]);
    let busy = client
        .get(url(&app, 8001, &sandbox.id, "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(busy.status().as_u16(), 503);
    let body: Value = busy.json().await.unwrap();
    assert_eq!(body["error"]["code"], "preview_busy", "{body}");
    first
        .send(Message::Text("still here".into()))
        .await
        .unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(5), first.next())
        .await
        .unwrap();
    assert_eq!(echoed.unwrap().unwrap().to_text().unwrap(), "still here");
    // Left idle, both are closed by the gateway, and the preview serves again.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = first.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "an idle WebSocket was kept open");
    wait_until(
        "the places to come back",
        Duration::from_secs(10),
        || async {
            client
                .get(url(&app, 8001, &sandbox.id, "/"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
                == 200
        },
    )
    .await;
    // Guessing a preview's token is guessing a key: an address's failures are counted, and
    // once spent it gets 429, while the right token still opens the preview.
    let private = open(&sandbox, json!({ "port": 8000 })).await;
    let right = private["token"].as_str().unwrap().to_owned();
    let client = preview_client(&app, &[host(8000, &sandbox.id)]);
    let target = url(&app, 8000, &sandbox.id, "/");
    let mut statuses = Vec::new();
    for guess in 0..8 {
        let answer = client
            .get(&target)
            .header("x-sandbase-preview-token", format!("sbp_guess{guess}"))
            .send()
            .await
            .unwrap();
        statuses.push(answer.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429, 429]);
    let admitted = client
        .get(&target)
        .header("x-sandbase-preview-token", &right)
        .send()
        .await
        .unwrap();
    // Admitted: nothing listens on 8000, which the worker says.
    assert_eq!(admitted.status().as_u16(), 502);
    worker.clean_up_with(&["base"]).await;
}
