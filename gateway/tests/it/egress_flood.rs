//! One sandbox floods the node's DNS responder and its egress proxy; another sandbox on the
//! same node keeps its egress, and its billing stays exact (the bytes metered are the
//! bytes its flows moved, to the byte).

use std::time::Duration;

use sandbase_egress::limits::{CONNECTIONS_BURST, DNS_BURST};
use sandbase_egress::testing::Upstream;
use serde_json::json;

use crate::egress::{NODE_NETWORK, credentials_worker, metered_egress};
use crate::helpers::spawn_app_with;
use crate::testbed::{TestWorker, create_ok, sh};

/// 5 000 DNS queries as fast as Python sends them; prints how many were answered.
const DNS_FLOOD: &str = r#"python3 - <<'EOF'
import socket, struct, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
def query(i):
    name = b"".join(bytes([len(p)]) + p for p in (b"q%d" % i, b"other", b"test", b"example"))
    return struct.pack(">HHHHHH", i & 0xffff, 0x0100, 1, 0, 0, 0) + name + b"\0" + struct.pack(">HH", 1, 1)
answered = 0
start = time.time()
for i in range(5000):
    try:
        s.sendto(query(i), ("192.0.2.53", 53))
    except BlockingIOError:
        pass
    try:
        while True:
            s.recv(1500)
            answered += 1
    except BlockingIOError:
        pass
deadline = time.time() + 2
while time.time() < deadline:
    try:
        s.recv(1500)
        answered += 1
    except BlockingIOError:
        time.sleep(0.01)
print("answered", answered, "in", round(time.time() - start, 1))
EOF"#;

/// 1 000 connections to the proxy as fast as they open, each asking for a CONNECT;
/// prints how many were let through and how many refused.
const CONNECTION_FLOOD: &str = r#"python3 - <<'EOF'
import os, socket
host, port = os.environ["HTTPS_PROXY"].split("//")[1].rstrip("/").split(":")
let_through = refused = 0
held = []
for i in range(1000):
    try:
        c = socket.create_connection((host, int(port)), timeout=5)
        c.sendall(b"CONNECT other.test.example:80 HTTP/1.1\r\n\r\n")
        answer = c.recv(100)
        if answer.startswith(b"HTTP/1.1 200"):
            let_through += 1
            held.append(c)
        else:
            refused += 1
            c.close()
    except OSError:
        refused += 1
print("let_through", let_through, "refused", refused)
EOF"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_sandbox_leaves_its_neighbours_egress_and_billing_exact() {
    let _network = NODE_NETWORK.lock().await;
    let upstream = Upstream::start();
    upstream.wait_ready().await;
    let app = spawn_app_with(|settings| {
        crate::testbed::configure_sandboxes(settings);
        settings.workers.heartbeat_ttl_secs = 5;
    })
    .await;
    let worker = TestWorker::start(credentials_worker(&app, &upstream)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let bob = app.signup("bob@example.com", "Bob").await;
    let flooder = create_ok(
        &app,
        &alice.api_key.token,
        json!({ "template": "base", "egress": { "allow": ["other.test.example"] } }),
    )
    .await;
    let victim = create_ok(
        &app,
        &bob.api_key.token,
        json!({ "template": "base", "egress": { "allow": ["api.test.example"] } }),
    )
    .await;
    // Bob's sandbox sends and gets back a megabyte, several times, while Alice's floods:
    // through CONNECT tunnels (its TLS is its own business here) and as plain HTTP.
    let transfer = "head -c 1000000 /dev/urandom > /tmp/mb; for url in https://api.test.example \
        http://api.test.example https://api.test.example http://api.test.example \
        https://api.test.example; do curl -sSk --max-time 20 -o /dev/null \
        -w '%{http_code} %{size_download}\\n' --data-binary @/tmp/mb $url/echo-body; done";
    let (dns, connections, transfers) = tokio::join!(
        sh(&app, &alice.api_key.token, &flooder, DNS_FLOOD),
        sh(&app, &alice.api_key.token, &flooder, CONNECTION_FLOOD),
        sh(&app, &bob.api_key.token, &victim, transfer),
    );
    // The flood was held to its buckets.
    let answered: f64 = dns["stdout"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(answered <= DNS_BURST + 400.0, "{dns}");
    let words: Vec<&str> = connections["stdout"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .collect();
    let let_through: f64 = words[1].parse().unwrap();
    assert!(let_through <= CONNECTIONS_BURST + 200.0, "{connections}");
    // The neighbour's transfers all went through, whole.
    assert_eq!(
        transfers["stdout"].as_str().unwrap(),
        "200 1000000\n".repeat(5),
        "{transfers}"
    );
    // Its billing is exact: the metered bytes are its flows' bytes.
    let flows = app
        .get(
            &format!("/v1/sandboxes/{victim}/egress"),
            &bob.api_key.token,
        )
        .await
        .body;
    let flowed: i64 = flows["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["bytes_up"].as_i64().unwrap() + f["bytes_down"].as_i64().unwrap())
        .sum();
    assert!(flowed > 10_000_000, "{flows}");
    crate::testbed::wait_until(
        "the neighbour's egress metered",
        Duration::from_secs(20),
        || async { metered_egress(&app, &victim).await == flowed },
    )
    .await;
    // The flooder's refusals reached the audit log folded, not one row per query.
    let rows = app
        .count(&format!(
            "SELECT count(*) FROM audit_events WHERE target = 'sandbox:{flooder}' \
             AND action = 'sandbox.egress_denied'"
        ))
        .await;
    // (One row per fold window: a loaded machine makes more, never one per query.)
    assert!(rows < 500, "{rows} audit rows for 5 000 refused queries");
    // Both sandboxes still work.
    for (token, id) in [
        (&alice.api_key.token, &flooder),
        (&bob.api_key.token, &victim),
    ] {
        let answer = sh(&app, token, id, "echo alive").await;
        assert_eq!(answer["stdout"], "alive\n");
        app.delete(&format!("/v1/sandboxes/{id}"), token).await;
    }
    worker.clean_up_with(&["base"]).await;
}
