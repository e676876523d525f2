//! Vaulted values read back through their own host: upstreams that echo their input (the
//! whole request, a stored body, a redirect reflecting the query, base64, chunked, TRACE)
//! hand the sandbox the placeholder, never the value; a compressed answer that cannot be
//! scrubbed is refused; a secret's `usable_by` decides who may attach it.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use serde_json::json;

use crate::egress_credentials::{GIT_TOKEN, Scene};
use crate::testbed::{create_ok, sh};

const QUERY_KEY: &str = "qk-Ab/Cd+Ef=Gh0123456789abcdefgh";
const HEADER_KEY: &str = "hk_9f8e7d6c5b4a39281706f5e4d3c2b1a0";
const BASIC_PASSWORD: &str = "bp-Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0";

/// Every form of `value` an echo can carry: literal, percent-encoded, and base64 and
/// base64url at each alignment inside a longer text.
fn forms(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_owned()];
    let percent: String = value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    forms.push(percent);
    for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        for offset in 0..3 {
            let mut padded = vec![0u8; offset];
            padded.extend_from_slice(value.as_bytes());
            let encoded = engine.encode(&padded);
            let (start, end) = ((offset * 8).div_ceil(6), padded.len() * 8 / 6);
            forms.push(encoded[start..end].to_owned());
        }
    }
    forms
}

fn assert_no_value(text: &str, what: &str) {
    for value in [QUERY_KEY, HEADER_KEY, BASIC_PASSWORD, GIT_TOKEN] {
        for form in forms(value) {
            assert!(
                !text.contains(&form),
                "{what}: a form of a vaulted value came back: {form}\n{text}"
            );
        }
    }
}

/// The attack from inside a sandbox holding four credentials for two echoing hosts.
pub async fn echoing_upstreams_hand_back_only_placeholders(scene: &Scene) {
    let (app, token, upstream) = (&scene.app, scene.token.as_str(), &scene.upstream);
    for (name, value, inject) in [
        ("echo_query", QUERY_KEY, json!({ "query": "key" })),
        ("echo_header", HEADER_KEY, json!({ "header": "X-Api-Key" })),
        (
            "echo_basic",
            BASIC_PASSWORD,
            json!({ "basic": { "username": "me" } }),
        ),
    ] {
        let created = app
            .post(
                "/v1/secrets",
                token,
                json!({ "name": name, "value": value, "hosts": ["echo.test.example"],
                        "inject": inject }),
            )
            .await;
        assert_eq!(created.status.as_u16(), 201, "{}", created.body);
    }
    let allow = json!(["echo.test.example", "git.test.example"]);
    let id = create_ok(
        app,
        token,
        json!({ "template": "base", "egress": { "allow": allow },
                "credentials": ["echo_query", "echo_header", "echo_basic", "git"] }),
    )
    .await;
    let placeholder = sh(app, token, &id, "printf %s \"$GIT_TOKEN\"").await["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    let script = "set -x; e=https://echo.test.example; \
        curl -sS -i --max-time 10 \"$e/echo?x=1\"; \
        curl -sS -i --max-time 10 \"$e/redirect?x=1\"; \
        curl -sS -i --max-time 10 \"$e/echo-b64\"; \
        curl -sS -i --max-time 10 \"$e/echo-chunked\"; \
        curl -sS -i --max-time 10 --compressed \"$e/echo-gzip\"; \
        curl -sS -i --max-time 10 -X TRACE \"$e/echo-trace\"; \
        curl -sS -i --max-time 10 --data-binary \"{\\\"model\\\": \\\"$GIT_TOKEN\\\"}\" \
             https://git.test.example/echo-body";
    let answer = sh(app, token, &id, script).await;
    let stdout = answer["stdout"].as_str().unwrap();
    // The attack reached the upstream with the values (what an echo would have returned).
    let requests = upstream.requests();
    for value in [HEADER_KEY, GIT_TOKEN] {
        assert!(
            requests.contains(value),
            "the upstream got {value}: {requests}"
        );
    }
    assert!(requests.contains("GET /redirect?x=1&key=qk-Ab%2FCd%2BEf%3DGh0123456789abcdefgh"));
    // … and none of it came back: every echo carries placeholders instead.
    assert_no_value(stdout, "the sandbox's view");
    assert_no_value(&answer.to_string(), "the exec answer");
    assert!(
        stdout.contains("HTTP/1.1 302") && stdout.contains("location: /login?x=1&key="),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{{\"model\": \"{placeholder}\"}}")),
        "{stdout}"
    );
    // The stored copy came back base64-encoded ("stored: …"), values in it scrubbed.
    assert!(stdout.contains("c3RvcmVkOi"), "{stdout}");
    // A compressed answer cannot be scrubbed: refused, not passed on.
    assert!(
        stdout.contains("HTTP/1.1 502") && stdout.contains("compressed body"),
        "{stdout}"
    );
    // TRACE never leaves.
    assert!(stdout.contains("HTTP/1.1 405"), "{stdout}");
    assert!(!requests.contains("TRACE /echo-trace"), "{requests}");
    // Compression was asked away on the way out.
    assert!(
        requests
            .to_ascii_lowercase()
            .contains("accept-encoding: identity"),
        "{requests}"
    );
    an_upgraded_stream_hands_back_only_placeholders(scene, &id).await;
    // The sandbox still works and its egress too.
    let again = sh(
        app,
        token,
        &id,
        "curl -sS --max-time 10 https://echo.test.example/echo",
    )
    .await;
    assert!(
        again["stdout"]
            .as_str()
            .unwrap()
            .starts_with("GET /echo?key="),
        "{again}"
    );
    app.delete(&format!("/v1/sandboxes/{id}"), token).await;
}

/// A connection upgraded (101) to another protocol, whose upstream writes the request it
/// got, values and all, into the new stream: what reaches the sandbox is scrubbed too.
async fn an_upgraded_stream_hands_back_only_placeholders(scene: &Scene, id: &str) {
    let (app, token) = (&scene.app, scene.token.as_str());
    let script = r#"python3 - <<'EOF'
import os, socket, ssl
NL = bytes([13, 10])
def head(lines):
    return NL.join(line.encode() for line in lines) + NL + NL
host, port = os.environ["https_proxy"].split("//")[1].rstrip("/").rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(head(["CONNECT echo.test.example:443 HTTP/1.1", "Host: echo.test.example:443"]))
answer = b""
while NL + NL not in answer:
    answer += s.recv(1)
t = ssl.create_default_context().wrap_socket(s, server_hostname="echo.test.example")
t.sendall(head(["GET /upgrade-greet HTTP/1.1", "Host: echo.test.example", "Upgrade: echo",
                "Connection: Upgrade", "Sec-WebSocket-Extensions: permessage-deflate"]))
data = b""
while b"END-GREETING" not in data:
    chunk = t.recv(4096)
    if not chunk:
        break
    data += chunk
t.sendall(b"ping" + bytes([10]))
while not data.endswith(b"ping" + bytes([10])):
    chunk = t.recv(4096)
    if not chunk:
        break
    data += chunk
print(data.decode(errors="replace"))
EOF"#;
    let answer = sh(app, token, id, script).await;
    let stdout = answer["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("HTTP/1.1 101")
            && stdout.contains("END-GREETING")
            && stdout.ends_with(
                "ping

"
            ),
        "{answer}"
    );
    // The upstream did greet with the values (the attack reached it) ...
    assert!(
        scene
            .upstream
            .requests()
            .contains("GET /upgrade-greet?key=")
    );
    // ... and the sandbox got placeholders only, uncompressed.
    assert_no_value(stdout, "the upgraded stream");
    assert!(stdout.contains("x-api-key: hk_"), "{stdout}");
    assert!(
        !scene
            .upstream
            .requests()
            .to_ascii_lowercase()
            .contains("sec-websocket-extensions"),
        "compression of the upgraded stream was asked away"
    );
}

/// `usable_by`: a member may attach only what the secret allows members to.
pub async fn only_allowed_roles_attach_a_secret(scene: &Scene) {
    let (app, token) = (&scene.app, scene.token.as_str());
    // A member's key (made by the owner, at the member role).
    let (_, member) = app
        .create_key(token, json!({ "name": "member", "role": "member" }))
        .await;
    let allow = json!(["api.test.example"]);
    app.post(
        "/v1/sandboxes",
        &member,
        json!({ "template": "base", "egress": { "allow": allow }, "credentials": ["api"] }),
    )
    .await
    .assert_error(403, "credential_not_usable");
    app.post(
        "/v1/runs",
        &member,
        json!({ "template": "base", "command": "true", "egress": { "allow": allow },
                "credentials": ["api"] }),
    )
    .await
    .assert_error(403, "credential_not_usable");
    let shared = app
        .post(
            "/v1/secrets",
            token,
            json!({ "name": "shared", "value": "shared-value-0123456789", "hosts": ["api.test.example"],
                    "inject": { "header": "X-Shared" }, "usable_by": "member" }),
        )
        .await;
    assert_eq!(shared.status.as_u16(), 201, "{}", shared.body);
    assert_eq!(shared.body["usable_by"], "member");
    let id = create_ok(
        app,
        &member,
        json!({ "template": "base", "egress": { "allow": allow }, "credentials": ["shared"] }),
    )
    .await;
    app.delete(&format!("/v1/sandboxes/{id}"), &member).await;
}
