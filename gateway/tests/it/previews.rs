//! Preview URLs on real sandboxes without egress: `python3 -m http.server` and a WebSocket
//! echo server inside a sandbox reached at `{port}-{id}.preview.localhost` through the
//! gateway and the worker (a connection made inside the sandbox's network namespace); the
//! token, the signed URL (traded for a cookie) and public previews; SandBase's token and
//! cookie never reaching the sandbox; other teams, other sandboxes' tokens, a port nothing
//! listens on, a closed preview; bytes metered as egress; gVisor too.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use sandbase_worker::service::TemplateSource;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::helpers::{TestApp, spawn_app_with};
use crate::testbed::{TestSandbox, TestWorker, configure_sandboxes, wait_until, worker_config};

pub(crate) const DOMAIN: &str = "preview.localhost";

/// An HTTP server on the port given that answers every GET with the request it saw (path and
/// headers, as JSON) and echoes WebSocket messages on an upgrade: Python's standard library
/// only.
pub(crate) const ECHO_SERVER: &str = r#"
import base64, hashlib, json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.echo()
        seen = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def echo(self):
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = int.from_bytes(self.rfile.read(2), "big")
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            size = bytes([length]) if length < 126 else bytes([126]) + length.to_bytes(2, "big")
            self.wfile.write(bytes([0x80 | opcode]) + size + data)
            self.wfile.flush()

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"#;

async fn preview_app() -> TestApp {
    preview_app_with(|_| {}).await
}

pub(crate) async fn preview_app_with(
    configure: impl FnOnce(&mut sandbase_gateway::Settings),
) -> TestApp {
    spawn_app_with(|settings| {
        configure_sandboxes(settings);
        settings.previews.domain = Some(DOMAIN.to_owned());
        settings.previews.scheme = "http".to_owned();
        configure(settings);
    })
    .await
}

/// The gateway's listener, where every preview host is sent.
pub(crate) fn gateway_addr(app: &TestApp) -> SocketAddr {
    app.address.trim_start_matches("http://").parse().unwrap()
}

pub(crate) fn host(port: u16, id: &str) -> String {
    format!("{port}-{id}.{DOMAIN}")
}

/// A client that resolves the preview hosts of `ids` to the gateway and follows no redirect.
pub(crate) fn preview_client(app: &TestApp, hosts: &[String]) -> reqwest::Client {
    let mut builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    for name in hosts {
        builder = builder.resolve(name, gateway_addr(app));
    }
    builder.build().unwrap()
}

pub(crate) fn url(app: &TestApp, port: u16, id: &str, path: &str) -> String {
    format!(
        "http://{}:{}{path}",
        host(port, id),
        gateway_addr(app).port()
    )
}

pub(crate) async fn open(sandbox: &TestSandbox<'_>, body: Value) -> Value {
    let opened = sandbox.post("/previews", body).await;
    assert_eq!(opened.status.as_u16(), 201, "{}", opened.body);
    opened.body
}

/// Starts `command` in the background and waits until the preview of `port` answers.
pub(crate) async fn serve(sandbox: &TestSandbox<'_>, command: &str, port: u16, token: &str) {
    let started = sandbox
        .exec(json!({ "command": command, "background": true }))
        .await;
    assert_eq!(started.status.as_u16(), 201, "{}", started.body);
    let client = preview_client(sandbox.app, &[host(port, &sandbox.id)]);
    let target = url(sandbox.app, port, &sandbox.id, "/");
    wait_until("the server to listen", Duration::from_secs(20), || {
        let request = client
            .get(&target)
            .header("x-sandbase-preview-token", token);
        async move {
            let answer = request.send().await.unwrap();
            if answer.status().as_u16() == 502 {
                let body: Value = answer.json().await.unwrap();
                assert_eq!(body["error"]["code"], "port_closed", "{body}");
                return false;
            }
            true
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_port_in_a_sandbox_without_egress_is_reached_through_its_preview_url() {
    let app = preview_app().await;
    let mut config = worker_config(&app, "pv", 4, 0);
    let tarball = std::env::var("SANDBASE_BASE_TARBALL")
        .expect("SANDBASE_BASE_TARBALL: the base root file system (scripts/setup builds it)");
    config
        .templates
        .push(("base".to_owned(), TemplateSource::Tarball(tarball.into())));
    let worker = TestWorker::start(config).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let bob = app.signup("bob@example.com", "Bob").await;
    let sandbox =
        TestSandbox::create(&app, &alice.api_key.token, json!({ "template": "base" })).await;
    let bobs = TestSandbox::create(&app, &bob.api_key.token, json!({})).await;

    http_server_behind_a_token(&sandbox).await;
    let (echo_token, echo_url) = signed_urls_and_stripped_credentials(&sandbox).await;
    websocket_through_the_preview(&sandbox, &echo_token).await;
    other_teams_and_other_tokens(&sandbox, &bobs, &echo_token).await;
    another_previews_page_cannot_ride_the_cookie(&sandbox).await;
    let (status, _, _) = sandbox
        .raw(reqwest::Method::DELETE, "/previews/8001", None)
        .await;
    assert_eq!(status.as_u16(), 204);
    let closed = preview_client(&app, &[host(8001, &sandbox.id)])
        .get(&echo_url)
        .header("x-sandbase-preview-token", &echo_token)
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status().as_u16(), 404);

    // What the previews carried is metered as the sandbox's egress.
    wait_until("preview bytes metered", Duration::from_secs(15), || async {
        crate::egress::metered_egress(&app, &sandbox.id).await > 0
    })
    .await;
    worker.clean_up_with(&["base"]).await;
}

/// `python3 -m http.server`: refused without the token, served with it; nothing listening
/// is a clear 502.
async fn http_server_behind_a_token(sandbox: &TestSandbox<'_>) {
    let app = sandbox.app;
    assert_eq!(
        sandbox
            .sh("mkdir -p /work/site && echo hello-preview > /work/site/hello.txt")
            .await["exit_code"],
        0
    );
    let opened = open(sandbox, json!({ "port": 8000 })).await;
    assert_eq!(
        opened["url"].as_str().unwrap(),
        format!("http://{}/", host(8000, &sandbox.id))
    );
    assert_eq!(opened["public"], false);
    let token = opened["token"].as_str().unwrap().to_owned();
    serve(
        sandbox,
        "cd /work/site && exec python3 -m http.server 8000 --bind 127.0.0.1",
        8000,
        &token,
    )
    .await;
    let client = preview_client(app, &[host(8000, &sandbox.id), host(9, &sandbox.id)]);
    let file = url(app, 8000, &sandbox.id, "/hello.txt");
    let refused = client.get(&file).send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "preview_unauthorized", "{body}");
    let wrong = client
        .get(&file)
        .header("x-sandbase-preview-token", "sbp_wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let served = client
        .get(&file)
        .header("x-sandbase-preview-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(served.status().as_u16(), 200);
    assert_eq!(served.text().await.unwrap(), "hello-preview\n");

    // A port nothing listens on.
    let closed = open(sandbox, json!({ "port": 9 })).await;
    let answer = client
        .get(url(app, 9, &sandbox.id, "/"))
        .header(
            "x-sandbase-preview-token",
            closed["token"].as_str().unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 502);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "port_closed", "{body}");
}

/// The signed URL leaves a cookie and redirects to the plain URL; SandBase's token and
/// cookie are taken out of what reaches the sandbox, the sandbox's own cookies kept; a
/// tampered signature is refused. Returns the echo server's token and URL.
async fn signed_urls_and_stripped_credentials(sandbox: &TestSandbox<'_>) -> (String, String) {
    let app = sandbox.app;
    let opened = open(sandbox, json!({ "port": 8001, "signed_url_ttl_secs": 600 })).await;
    let token = opened["token"].as_str().unwrap().to_owned();
    sandbox
        .put_file("/work/echo.py", ECHO_SERVER.as_bytes().to_vec())
        .await;
    serve(sandbox, "exec python3 /work/echo.py 8001", 8001, &token).await;
    let client = preview_client(app, &[host(8001, &sandbox.id)]);
    let signed = opened["signed_url"].as_str().unwrap();
    let query = signed.split_once('?').unwrap().1;
    let signed = url(app, 8001, &sandbox.id, &format!("/page?a=1&{query}"));
    let traded = client.get(&signed).send().await.unwrap();
    assert_eq!(traded.status().as_u16(), 307);
    assert_eq!(traded.headers()["location"], "/page?a=1");
    let cookie = traded.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.starts_with("sandbase_preview=") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();

    let page = url(app, 8001, &sandbox.id, "/page?a=1");
    let seen: Value = client
        .get(&page)
        .header("cookie", format!("theirs=1; {pair}"))
        .header("x-sandbase-preview-token", &token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seen["path"], "/page?a=1", "{seen}");
    assert_eq!(seen["headers"]["cookie"], "theirs=1", "{seen}");
    assert!(
        seen["headers"].get("x-sandbase-preview-token").is_none(),
        "{seen}"
    );
    assert_eq!(
        seen["headers"]["host"],
        format!("{}:{}", host(8001, &sandbox.id), gateway_addr(app).port())
    );
    // The cookie alone opens it.
    let by_cookie = client
        .get(&page)
        .header("cookie", pair.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(by_cookie.status().as_u16(), 200);
    // A tampered signature or expiry is refused.
    let (expiry, signature) = pair
        .trim_start_matches("sandbase_preview=")
        .split_once('.')
        .unwrap();
    for forged in [
        format!(
            "sandbase_preview={}.{signature}",
            expiry.parse::<i64>().unwrap() + 3600
        ),
        format!(
            "sandbase_preview={expiry}.{}",
            signature.replace(|c: char| c.is_ascii_alphabetic(), "A")
        ),
    ] {
        let answer = client
            .get(&page)
            .header("cookie", forged)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 401);
    }
    (token, page)
}

/// A WebSocket (a dev server's hot reload) passes through the preview both ways.
async fn websocket_through_the_preview(sandbox: &TestSandbox<'_>, token: &str) {
    let app = sandbox.app;
    let mut request = format!(
        "ws://{}:{}/ws",
        host(8001, &sandbox.id),
        gateway_addr(app).port()
    )
    .into_client_request()
    .unwrap();
    request
        .headers_mut()
        .insert("x-sandbase-preview-token", token.parse().unwrap());
    let stream = tokio::net::TcpStream::connect(gateway_addr(app))
        .await
        .unwrap();
    let (mut socket, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    for message in ["hello", "hot reload", &"x".repeat(10_000)] {
        socket.send(Message::Text(message.into())).await.unwrap();
        let echoed = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(echoed.to_text().unwrap(), message);
    }
    socket.close(None).await.unwrap();
}

/// Every preview is a site of the previews' domain: a page of another preview (a tenant's
/// dev server) sends the victim's cookie along on its `fetch`es and WebSockets. Those are
/// refused; a link followed from any site (a top-level navigation) and the preview's own
/// requests are served.
async fn another_previews_page_cannot_ride_the_cookie(sandbox: &TestSandbox<'_>) {
    let app = sandbox.app;
    let opened = open(sandbox, json!({ "port": 8001, "signed_url_ttl_secs": 600 })).await;
    let client = preview_client(app, &[host(8001, &sandbox.id)]);
    let signed = opened["signed_url"].as_str().unwrap();
    let query = signed.split_once('?').unwrap().1;
    let traded = client
        .get(url(app, 8001, &sandbox.id, &format!("/?{query}")))
        .send()
        .await
        .unwrap();
    let cookie = traded.headers()["set-cookie"].to_str().unwrap();
    let pair = cookie.split(';').next().unwrap().to_owned();
    let page = url(app, 8001, &sandbox.id, "/page");
    let with = |site: &str, mode: &str, dest: &str| {
        client
            .get(&page)
            .header("cookie", &pair)
            .header("sec-fetch-site", site)
            .header("sec-fetch-mode", mode)
            .header("sec-fetch-dest", dest)
            .send()
    };
    for (site, mode, dest) in [
        ("same-site", "cors", "empty"),
        ("cross-site", "no-cors", "image"),
        ("same-site", "no-cors", "script"),
        ("same-site", "navigate", "iframe"),
    ] {
        let answer = with(site, mode, dest).await.unwrap();
        assert_eq!(answer.status().as_u16(), 403, "{site} {mode} {dest}");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["error"]["code"], "preview_cross_site", "{body}");
    }
    for (site, mode, dest) in [
        ("cross-site", "navigate", "document"),
        ("same-origin", "cors", "empty"),
        ("none", "navigate", "document"),
    ] {
        let answer = with(site, mode, dest).await.unwrap();
        assert_eq!(answer.status().as_u16(), 200, "{site} {mode} {dest}");
    }
    // A WebSocket opened by another preview's page carries that page's Origin.
    let own = format!(
        "http://{}:{}",
        host(8001, &sandbox.id),
        gateway_addr(app).port()
    );
    let other = format!(
        "http://{}:{}",
        host(8002, &sandbox.id),
        gateway_addr(app).port()
    );
    for (origin, admitted) in [(other.as_str(), false), (own.as_str(), true)] {
        let mut request = format!(
            "ws://{}:{}/ws",
            host(8001, &sandbox.id),
            gateway_addr(app).port()
        )
        .into_client_request()
        .unwrap();
        request
            .headers_mut()
            .insert("cookie", pair.parse().unwrap());
        request
            .headers_mut()
            .insert("origin", origin.parse().unwrap());
        let stream = tokio::net::TcpStream::connect(gateway_addr(app))
            .await
            .unwrap();
        let connected = tokio_tungstenite::client_async(request, stream).await;
        assert_eq!(connected.is_ok(), admitted, "a WebSocket from {origin}");
    }
    // The signed URL never leaves in a Referer.
    assert_eq!(traded.headers()["referrer-policy"], "no-referrer");
}

/// Another team cannot open or list this sandbox's previews; a token of another sandbox or
/// another port opens nothing here; public previews need nothing.
async fn other_teams_and_other_tokens(
    sandbox: &TestSandbox<'_>,
    bobs: &TestSandbox<'_>,
    token: &str,
) {
    let app = sandbox.app;
    let foreign = app
        .post(
            &sandbox.path("/previews"),
            &bobs.token,
            json!({ "port": 8001 }),
        )
        .await;
    assert_eq!(foreign.status.as_u16(), 404, "{}", foreign.body);
    let listed = app.get(&sandbox.path("/previews"), &bobs.token).await;
    assert_eq!(listed.status.as_u16(), 404, "{}", listed.body);
    let bobs_preview = open(bobs, json!({ "port": 8001 })).await;
    let bobs_token = bobs_preview["token"].as_str().unwrap();
    let client = preview_client(
        app,
        &[
            host(8001, &sandbox.id),
            host(8000, &sandbox.id),
            host(8001, &bobs.id),
        ],
    );
    for (port, id, presented) in [
        (8001, &sandbox.id, bobs_token),
        (8000, &sandbox.id, token),
        (8001, &bobs.id, token),
    ] {
        let answer = client
            .get(url(app, port, id, "/"))
            .header("x-sandbase-preview-token", presented)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 401, "{port}-{id}");
    }
    // From inside Bob's sandbox, Alice's server is out of reach: not through the gateway's
    // preview listener (the sandbox's 127.0.0.1 is its own loopback, and it has no other
    // route), not by its port.
    // A listener of Bob's own (port 8002) shows the probe works.
    let gateway_port = gateway_addr(app).port();
    let probed = bobs
        .sh(&format!(
            "(nc -l -p 8002 </dev/null >/dev/null &); sleep 0.5; \
             for target in 127.0.0.1:8002 127.0.0.1:{gateway_port} 127.0.0.1:8000; do \
               nc -w 3 ${{target%:*}} ${{target#*:}} </dev/null && echo reached $target; \
             done; echo probed"
        ))
        .await;
    let text = probed["stdout"].as_str().unwrap_or_default();
    assert_eq!(text, "reached 127.0.0.1:8002\nprobed\n", "{probed}");
    // An unknown sandbox id is no preview at all.
    let unknown = uuid::Uuid::now_v7().to_string();
    let client = preview_client(app, &[host(8001, &unknown)]);
    let answer = client
        .get(url(app, 8001, &unknown, "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 404);
    // Made public, it needs nothing.
    let public = open(sandbox, json!({ "port": 8001, "public": true })).await;
    assert_eq!(public["public"], true);
    let client = preview_client(app, &[host(8001, &sandbox.id)]);
    let answer = client
        .get(url(app, 8001, &sandbox.id, "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let listed = sandbox.get("/previews").await;
    assert_eq!(
        listed.body["previews"].as_array().unwrap().len(),
        3,
        "{}",
        listed.body
    );
    assert!(listed.body["previews"][0].get("token").is_none());
    // Opened again, it has a new token: the earlier one opens nothing.
    let renewed = open(sandbox, json!({ "port": 8001 })).await;
    let old = client
        .get(url(app, 8001, &sandbox.id, "/"))
        .header("x-sandbase-preview-token", token)
        .send()
        .await
        .unwrap();
    assert_eq!(old.status().as_u16(), 401);
    let new = client
        .get(url(app, 8001, &sandbox.id, "/"))
        .header(
            "x-sandbase-preview-token",
            renewed["token"].as_str().unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(new.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_preview_reaches_a_server_in_a_gvisor_sandbox() {
    let app = preview_app().await;
    let worker = TestWorker::start(worker_config(&app, "pg", 2, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let sandbox =
        TestSandbox::create(&app, &alice.api_key.token, json!({ "isolation": "gvisor" })).await;
    // A server of busybox's: a shell answering each connection (busybox's httpd drops a
    // request that arrives a moment after the connection under this runsc).
    let respond = "#!/bin/sh\nwhile read -r line; do [ \"${line%$(printf '\\r')}\" = '' ] && break; done\n\
                   printf 'HTTP/1.1 200 OK\\r\\nContent-Length: 12\\r\\nConnection: close\\r\\n\\r\\nfrom-gvisor\\n'\n";
    sandbox
        .put_file("/work/respond.sh", respond.as_bytes().to_vec())
        .await;
    assert_eq!(
        sandbox.sh("chmod +x /work/respond.sh").await["exit_code"],
        0
    );
    let opened = open(&sandbox, json!({ "port": 8000, "public": true })).await;
    serve(
        &sandbox,
        "exec busybox nc -ll -p 8000 -e /work/respond.sh",
        8000,
        opened["token"].as_str().unwrap(),
    )
    .await;
    let client = preview_client(&app, &[host(8000, &sandbox.id)]);
    let answer = client
        .get(url(&app, 8000, &sandbox.id, "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200, "{:?}", answer.text().await);
    assert_eq!(answer.text().await.unwrap(), "from-gvisor\n");
    // Destroyed, its previews answer no more.
    assert_eq!(sandbox.delete("").await.status.as_u16(), 204);
    let gone = client
        .get(url(&app, 8000, &sandbox.id, "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status().as_u16(), 409);
    worker.clean_up().await;
}

/// Destroying a sandbox ends everything its sessions held: a preview request in flight (its
/// relay through the worker), a terminal's output stream, the sandbox's control directory
/// and its mount; its previews answer no more.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_of_a_sandboxs_sessions_is_left_after_destroy() {
    let app = preview_app().await;
    let worker = TestWorker::start(worker_config(&app, "pd", 2, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let sandbox = TestSandbox::create(&app, &alice.api_key.token, json!({})).await;
    let node = worker.running().node().clone();
    let container = node
        .get(sandbox.id.parse().unwrap())
        .unwrap()
        .sandbox
        .id
        .clone();
    let control = worker.config.worker.run_dir.join(&container);
    assert!(control.exists());

    // A terminal whose output is being read, and a preview request the server never answers.
    let opened = sandbox.post("/pty", json!({})).await;
    assert_eq!(opened.status.as_u16(), 201, "{}", opened.body);
    let output = app
        .http
        .get(format!(
            "{}{}",
            app.address,
            sandbox.path(&format!(
                "/pty/{}/output?since=0",
                opened.body["session_id"]
            ))
        ))
        .bearer_auth(&sandbox.token)
        .send()
        .await
        .unwrap();
    assert_eq!(output.status().as_u16(), 200);
    let reading = tokio::spawn(async move { output.bytes().await.map(|bytes| bytes.len()) });
    let opened = open(&sandbox, json!({ "port": 8000, "public": true })).await;
    let listening = sandbox
        .exec(json!({ "command": "exec busybox nc -ll -p 8000 -e sleep 1000", "background": true }))
        .await;
    assert_eq!(listening.status.as_u16(), 201, "{}", listening.body);
    assert_eq!(opened["public"], true);
    let client = preview_client(&app, &[host(8000, &sandbox.id)]);
    let target = url(&app, 8000, &sandbox.id, "/");
    wait_until("nc to listen", Duration::from_secs(20), || async {
        sandbox.sh("netstat -ltn | grep -q ':8000 '").await["exit_code"] == 0
    })
    .await;
    let waiting = tokio::spawn({
        let (client, target) = (client.clone(), target.clone());
        async move {
            client
                .get(&target)
                .send()
                .await
                .map(|answer| answer.status().as_u16())
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiting.is_finished(),
        "the preview request should hang until destroy"
    );

    assert_eq!(sandbox.delete("").await.status.as_u16(), 204);
    let ended = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the preview request ended with the sandbox")
        .unwrap();
    assert!(
        ended.as_ref().map_or(true, |status| *status == 502),
        "{ended:?}"
    );
    tokio::time::timeout(Duration::from_secs(15), reading)
        .await
        .expect("the terminal's output stream ended with the sandbox")
        .unwrap()
        .ok();
    assert!(node.ids().is_empty());
    assert!(!control.exists(), "{}", control.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&container),
        "a mount of the sandbox is left"
    );
    let gone = client.get(&target).send().await.unwrap();
    assert_eq!(gone.status().as_u16(), 409);
    worker.clean_up().await;
}
