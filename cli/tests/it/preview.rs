//! `sandbox preview` in the CLI scenario: a page a sandbox serves, reached through the
//! gateway's preview host.

use crate::{Server, stderr, stdout};

/// `sandbox preview`: the signed URL to open by default, the plain one when public; the
/// public one answers with the page the sandbox serves.
pub async fn preview_step(server: &Server, id: &str) {
    let output = server.cli(
        &[
            "sandbox",
            "exec",
            id,
            "--",
            "sh",
            "-c",
            "mkdir -p /work/www && echo page > /work/www/index.html",
        ],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let output = server.cli(
        &[
            "sandbox",
            "exec",
            id,
            "--background",
            "--",
            "busybox",
            "httpd",
            "-f",
            "-p",
            "127.0.0.1:8000",
            "-h",
            "/work/www",
        ],
        &[],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let host = format!("8000-{id}.preview.localhost");
    let output = server.cli(&["sandbox", "preview", id, "8000"], &[], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let signed = stdout(&output).trim().to_owned();
    assert!(
        signed.starts_with(&format!("https://{host}/?sandbase_preview="))
            || signed.starts_with(&format!("http://{host}/?sandbase_preview=")),
        "{signed}"
    );
    assert!(stderr(&output).contains("x-sandbase-preview-token: sbp_"));
    let output = server.cli(&["sandbox", "preview", id, "8000", "--public"], &[], None);
    let url = stdout(&output).trim().to_owned();
    assert_eq!(url, format!("http://{host}/"), "{}", stderr(&output));
    let gateway: std::net::SocketAddr = server.url.trim_start_matches("http://").parse().unwrap();
    let client = reqwest::Client::builder()
        .resolve(&host, gateway)
        .build()
        .unwrap();
    let page = format!("http://{host}:{}/", gateway.port());
    for _ in 0..100 {
        let answer = client.get(&page).send().await.unwrap();
        if answer.status().as_u16() == 200 {
            assert_eq!(answer.text().await.unwrap(), "page\n");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the preview never answered");
}
