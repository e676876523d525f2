//! A preview URL against a direct connection into the sandbox's network namespace: the same
//! HTTP request to busybox's httpd in the sandbox (which closes every connection, so each
//! request is a new connection to it either way), through the gateway's preview host (the
//! client keeps its connection to the gateway, as a browser does) and made by this process
//! on a connection it opens inside the namespace itself.

use std::time::Instant;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Api, Samples};

pub struct PreviewSamples {
    preview: Samples,
    direct: Samples,
}

const PAGE: &str = "preview-bench-page\n";

pub async fn preview_samples(
    api: &Api,
    node: &sandbase_worker::node::Node,
    id: &str,
    requests: usize,
) -> PreviewSamples {
    let (status, answer) = api
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": format!("mkdir -p /work/www && printf '{}' > /work/www/index.html", PAGE.trim_end().to_owned() + "\\n") }),
        )
        .await;
    assert_eq!((status, &answer["exit_code"]), (200, &json!(0)), "{answer}");
    let (status, answer) = api
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": "exec busybox httpd -f -p 127.0.0.1:8000 -h /work/www", "background": true }),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let (status, opened) = api
        .post(
            &format!("/v1/sandboxes/{id}/previews"),
            json!({ "port": 8000 }),
        )
        .await;
    assert_eq!(status, 201, "{opened}");
    let token = opened["token"].as_str().expect("token").to_owned();
    let gateway: std::net::SocketAddr =
        api.url.trim_start_matches("http://").parse().expect("addr");
    let host = format!("8000-{id}.preview.localhost");
    let client = reqwest::Client::builder()
        .resolve(&host, gateway)
        .build()
        .expect("client");
    let url = format!("http://{host}:{}/", gateway.port());
    let hosted = node.get(id.parse().expect("id")).expect("hosted");
    let namespace = hosted.netns.as_ref().expect("namespace");

    let fetch = || async {
        let answer = client
            .get(&url)
            .header("x-sandbase-preview-token", &token)
            .send()
            .await
            .expect("preview");
        (
            answer.status().as_u16(),
            answer.text().await.unwrap_or_default(),
        )
    };
    // The server starts; then a few untimed requests warm both paths up.
    for _ in 0..200 {
        if fetch().await.0 == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (mut preview, mut direct) = (Samples(Vec::new()), Samples(Vec::new()));
    for round in 0..requests + 20 {
        let started = Instant::now();
        let (status, body) = fetch().await;
        let elapsed = started.elapsed();
        assert_eq!((status, body.as_str()), (200, PAGE));
        let started = Instant::now();
        let mut stream = sandbase_worker::namespace::connect_inside(namespace, 8000)
            .await
            .expect("connect inside");
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: bench\r\nAccept: */*\r\n\r\n")
            .await
            .expect("write");
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.expect("read");
        let direct_elapsed = started.elapsed();
        assert!(response.ends_with(PAGE.as_bytes()));
        if round >= 20 {
            preview.0.push(elapsed);
            direct.0.push(direct_elapsed);
        }
    }
    PreviewSamples { preview, direct }
}

impl PreviewSamples {
    pub fn print(mut self) {
        let (ours, theirs) = (self.preview.ms(0.5), self.direct.ms(0.5));
        println!(
            "| HTTP GET through a preview URL | {ours:.2} | {:.2} | a connection made inside the sandbox's namespace | {theirs:.2} | {:.2} | {:.2} (+{:.2} ms) |",
            self.preview.ms(0.99),
            self.direct.ms(0.99),
            ours / theirs,
            ours - theirs
        );
    }
}
