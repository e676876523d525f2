//! Egress from inside real sandboxes: a veth into the sandbox's namespace, SandBase's
//! nftables table, the node's egress proxy, and an upstream HTTP server in a network namespace
//! of the test's own (a documentation address, reached by name through the worker's explicit
//! resolver table — the SSRF guard is the production one).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use sandbase_egress::proxy::Resolver;
use sandbase_egress::testing::Upstream;
use sandbase_worker::network::{EgressConfig, PROXY_USER};
use sandbase_worker::service::TemplateSource;
use serde_json::json;

use serde_json::Value;

use crate::testbed::{TestWorker, create_ok, sandbox_app, sh, worker_config};

/// A base port for the egress proxy: it binds TCP `port`, `port + 1`, `port + 2` and UDP
/// `port + 3` on every address. Taken below the kernel's ephemeral range, where the suite's
/// own outgoing connections (which take ephemeral ports) cannot be holding one of them.
pub fn proxy_ports() -> u16 {
    use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
    for _ in 0..1000 {
        let base: u16 = rand::random_range(20_000..32_000);
        let at = |offset: u16| SocketAddr::from((Ipv4Addr::UNSPECIFIED, base + offset));
        let free = (0..3).all(|offset| TcpListener::bind(at(offset)).is_ok())
            && UdpSocket::bind(at(3)).is_ok();
        if free {
            return base;
        }
    }
    panic!("no four free ports for the egress proxy");
}

/// The `sandbase` executable, whose `egress-proxy` the worker runs (scripts/test builds it).
pub fn proxy_program() -> std::path::PathBuf {
    std::env::var_os("SANDBASE_BINARY")
        .expect("SANDBASE_BINARY: the sandbase executable (scripts/test builds it)")
        .into()
}

/// One egress test at a time: each worker owns the node's nftables table and pool.
pub static NODE_NETWORK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The scenario's cast: a gateway and a worker with an egress network, an upstream in a
/// network namespace of the test's own, Alice's sandboxes (`id` may reach several names,
/// `other` one, `closed` none) and Bob of another team.
struct Scene {
    app: crate::helpers::TestApp,
    token: String,
    upstream: Upstream,
    id: String,
    other: String,
    closed: String,
    bob: sandbase_api::SignupResponse,
}

/// Raw HTTP through the proxy named by the sandbox's `http_proxy` (with nc: the static
/// busybox has no resolver library, and needs none with a proxy).
fn through_proxy(host: &str, path: &str) -> String {
    format!(
        "p=${{http_proxy#http://}}; printf 'GET http://{host}{path} HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n' | nc -w 5 ${{p%:*}} ${{p#*:}}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_reaches_only_allowed_hosts_through_the_proxy() {
    let _network = NODE_NETWORK.lock().await;
    // The same egress link, proxy and policy under both isolation levels.
    for isolation in ["runc", "gvisor"] {
        let (scene, worker) = egress_scene(isolation).await;
        allowed_hosts_pass_and_denied_or_internal_ones_get_403(&scene).await;
        nothing_goes_around_the_proxy(&scene).await;
        the_flow_log_and_the_egress_charge_tell_what_went_out(&scene).await;
        redirected_port_80_follows_the_host_header_and_the_policy(&scene).await;
        a_policy_change_applies_to_the_next_connection(&scene).await;
        without_egress_a_sandbox_has_loopback_only_and_policies_are_checked(&scene).await;
        the_team_default_policy_applies_to_sandboxes_that_name_none(&scene).await;
        destroyed_sandboxes_leave_no_link_behind(&scene).await;
        worker.clean_up().await;
    }
}

/// Starts the upstream, a gateway and a worker with an egress network, and Alice's three
/// sandboxes (isolated by `isolation`).
async fn egress_scene(isolation: &str) -> (Scene, TestWorker) {
    let upstream = Upstream::start();
    upstream.wait_ready().await;
    let public = IpAddr::V4(upstream.address);
    let app = sandbox_app().await;
    let mut config = worker_config(&app, "w", 8, 0);
    config.node.egress = Some(EgressConfig {
        pool: "10.213.0.0".parse().unwrap(),
        proxy_port: proxy_ports(),
        resolver: Resolver::Fixed(HashMap::from([
            ("allowed.test.example".to_owned(), vec![public]),
            ("denied.test.example".to_owned(), vec![public]),
            (
                "loopback.test.example".to_owned(),
                vec!["127.0.0.1".parse().unwrap()],
            ),
            (
                "metadata.test.example".to_owned(),
                vec!["169.254.169.254".parse().unwrap()],
            ),
            // The second sandbox's address (the pool's second /30), and the node's side of
            // the first sandbox's link.
            (
                "sibling.test.example".to_owned(),
                vec!["10.213.0.6".parse().unwrap()],
            ),
            (
                "node.test.example".to_owned(),
                vec!["10.213.0.1".parse().unwrap()],
            ),
            // A public-looking address of the fleet, on the operator's deny-list.
            (
                "fleet.test.example".to_owned(),
                vec!["203.0.113.250".parse().unwrap()],
            ),
        ])),
        node_addresses: Vec::new(),
        denied_networks: vec![sandbase_egress::ssrf::Cidr::parse("203.0.113.248/29").unwrap()],
        max_connections: 16,
        extra_ca: None,
        proxy_program: proxy_program(),
        proxy_user: Some(PROXY_USER),
        restart_delay: Duration::from_secs(3),
    });
    let worker = TestWorker::start(config).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    let id = create_ok(
        &app,
        token,
        json!({ "isolation": isolation, "egress": { "allow": [
            "allowed.test.example",
            "loopback.test.example",
            "metadata.test.example",
            "sibling.test.example",
            "node.test.example",
            "fleet.test.example",
        ] } }),
    )
    .await;
    let sandbox = scene_get(&app, token, &id).await;
    assert_eq!(sandbox["isolation"], isolation, "{sandbox}");
    let other = create_ok(
        &app,
        token,
        json!({ "isolation": isolation, "egress": { "allow": ["allowed.test.example"] } }),
    )
    .await;
    let closed = create_ok(&app, token, json!({ "isolation": isolation })).await;
    let bob = app.signup("bob@example.com", "Bob").await;
    let scene = Scene {
        token: token.to_owned(),
        upstream,
        id,
        other,
        closed,
        bob,
        app,
    };
    (scene, worker)
}

/// Allowed: through the proxy named by the sandbox's `http_proxy` (raw HTTP with nc:
/// the static busybox has no resolver library, and needs none with a proxy).
async fn allowed_hosts_pass_and_denied_or_internal_ones_get_403(scene: &Scene) {
    let (app, token, id) = (&scene.app, scene.token.as_str(), &scene.id);
    let answer = sh(
        app,
        token,
        id,
        &through_proxy("allowed.test.example", "/hello"),
    )
    .await;
    let stdout = answer["stdout"].as_str().unwrap();
    assert!(
        stdout.contains(" 200 ") && stdout.contains("GET /hello HTTP/1.1"),
        "{answer}"
    );
    // Not on the policy, or an allowed name that resolves to an internal address: 403.
    for (host, why) in [
        (
            "denied.test.example",
            "not allowed by this sandbox's egress policy",
        ),
        ("loopback.test.example", "loopback address"),
        ("metadata.test.example", "cloud metadata address"),
        ("sibling.test.example", "private address"),
        ("node.test.example", "address"),
        ("fleet.test.example", "a network the operator denies"),
    ] {
        let answer = sh(app, token, id, &through_proxy(host, "/")).await;
        let stdout = answer["stdout"].as_str().unwrap();
        assert!(
            stdout.starts_with("HTTP/1.1 403") && stdout.contains(why),
            "{host}: {answer}"
        );
        // The refusal names the kind of address, never the address itself.
        for internal in ["127.0.0.1", "169.254.169.254", "10.213.0", "203.0.113.250"] {
            assert!(!stdout.contains(internal), "{host}: {answer}");
        }
    }
    // The team's flow log keeps the detail (flows reach it a moment after they end).
    crate::testbed::wait_until(
        "the refused flow's address in the flow log",
        Duration::from_secs(10),
        || async {
            let flows = app
                .get(&format!("/v1/sandboxes/{id}/egress"), token)
                .await
                .body;
            flows["flows"].as_array().is_some_and(|flows| {
                flows.iter().any(|flow| {
                    flow["host"] == "fleet.test.example"
                        && flow["address"]
                            .as_str()
                            .is_some_and(|a| a.starts_with("203.0.113.250"))
                })
            })
        },
    )
    .await;
}

/// Around the proxy: the upstream's address directly, the proxy's host on another port,
/// another sandbox — all dropped.
async fn nothing_goes_around_the_proxy(scene: &Scene) {
    let (app, token, upstream, id, other) = (
        &scene.app,
        scene.token.as_str(),
        &scene.upstream,
        &scene.id,
        &scene.other,
    );
    // The pool's second /30 is the other sandbox's, the first's node side is its gateway
    // (what sibling.test.example and node.test.example name). The address is read back
    // where the sandbox's tools can list it (gVisor's view of the link has none).
    let (other_ip, gateway_ip) = ("10.213.0.6", "10.213.0.1");
    let listed = sh(app, token, other, "ip -4 -o addr show eth0 2>/dev/null").await;
    if let Some(listed) = listed["stdout"].as_str().filter(|out| out.contains("inet")) {
        assert!(listed.contains(&format!("{other_ip}/30")), "{listed}");
    }
    for (what, command) in [
        (
            "the upstream directly on a port that is not redirected",
            format!("nc -w 3 {} 8080 </dev/null", upstream.address),
        ),
        (
            "the host on another port",
            format!("nc -w 3 {gateway_ip} 22 </dev/null"),
        ),
        (
            "another sandbox",
            format!("nc -w 3 {other_ip} 8080 </dev/null"),
        ),
    ] {
        let answer = sh(app, token, id, &command).await;
        assert!(
            !answer["stdout"]
                .as_str()
                .unwrap_or_default()
                .contains("GET /"),
            "{what}: {answer}"
        );
        assert_ne!(answer["exit_code"], 0, "{what}: {answer}");
    }
}

/// The flow log: what was allowed (with bytes) and what was denied, and why.
async fn the_flow_log_and_the_egress_charge_tell_what_went_out(scene: &Scene) {
    let (app, token, id) = (&scene.app, scene.token.as_str(), &scene.id);
    let flows = app
        .get(&format!("/v1/sandboxes/{id}/egress"), token)
        .await
        .body;
    let flows = flows["flows"].as_array().unwrap();
    let allowed: Vec<&serde_json::Value> = flows
        .iter()
        .filter(|f| f["decision"] == "allowed" && f["mode"] == "http")
        .collect();
    assert_eq!(allowed.len(), 1, "{flows:?}");
    assert_eq!(allowed[0]["host"], "allowed.test.example");
    assert!(
        allowed[0]["bytes_down"].as_u64().unwrap() > 100,
        "{flows:?}"
    );
    let denied: Vec<&str> = flows
        .iter()
        .filter(|f| f["decision"] == "denied")
        .map(|f| f["host"].as_str().unwrap())
        .collect();
    assert_eq!(
        denied,
        [
            "denied.test.example",
            "loopback.test.example",
            "metadata.test.example",
            "sibling.test.example",
            "node.test.example",
            "fleet.test.example"
        ]
    );

    // Allowed bytes become `egress_bytes` usage, charged to the team for this sandbox.
    // Metered from the proxy's running totals: exactly the bytes of the allowed flow.
    let flowed =
        allowed[0]["bytes_up"].as_i64().unwrap() + allowed[0]["bytes_down"].as_i64().unwrap();
    crate::testbed::wait_until("the egress charge", Duration::from_secs(15), || async {
        app.count(&format!(
            "SELECT count(*) FROM ledger_transactions WHERE kind = 'debit' \
             AND details->>'kind' = 'egress_bytes' AND details->>'sandbox' = '{id}'"
        ))
        .await
            >= 1
            && metered_egress(app, id).await == flowed
    })
    .await;
}

/// The `egress_bytes` the gateway received for a sandbox.
pub async fn metered_egress(app: &crate::helpers::TestApp, id: &str) -> i64 {
    let (quantity,): (Option<i64>,) = sqlx::query_as(
        "SELECT sum(quantity)::bigint FROM usage_events WHERE sandbox_id = $1::uuid AND kind = 'egress_bytes'",
    )
    .bind(id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    quantity.unwrap_or(0)
}

/// Port 80 straight to the upstream's address, ignoring the proxy variables: redirected to
/// the proxy, which goes by the Host header and the policy.
async fn redirected_port_80_follows_the_host_header_and_the_policy(scene: &Scene) {
    let (app, token, upstream, id) = (&scene.app, scene.token.as_str(), &scene.upstream, &scene.id);
    for (host, expected) in [
        ("denied.test.example", "HTTP/1.1 403"),
        ("allowed.test.example", "HTTP/1.1 200"),
    ] {
        let answer = sh(
            app,
            token,
            id,
            &format!(
                "printf 'GET /direct HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n' | nc -w 5 {} 80",
                upstream.address
            ),
        )
        .await;
        assert!(
            answer["stdout"].as_str().unwrap().starts_with(expected),
            "{host}: {answer}"
        );
    }
    // A flow is recorded when its connection ends, which may be a moment after the command
    // that made it exits: the flow log is read until both are there (or the wait ends).
    let transparent = |flows: &Value| -> Vec<(String, String)> {
        flows["flows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["mode"] == "transparent-http")
            .map(|f| {
                let field = |name: &str| f[name].as_str().unwrap().to_owned();
                (field("host"), field("decision"))
            })
            .collect()
    };
    let expected = [
        ("denied.test.example", "denied"),
        ("allowed.test.example", "allowed"),
    ]
    .map(|(host, decision)| (host.to_owned(), decision.to_owned()));
    let path = format!("/v1/sandboxes/{id}/egress");
    crate::testbed::wait_until("both redirected flows", Duration::from_secs(10), || async {
        transparent(&app.get(&path, token).await.body).len() >= 2
    })
    .await;
    assert_eq!(transparent(&app.get(&path, token).await.body), expected);
}

/// A policy change applies to the next connection.
async fn a_policy_change_applies_to_the_next_connection(scene: &Scene) {
    let (app, token, id, closed) = (&scene.app, scene.token.as_str(), &scene.id, &scene.closed);
    let policy = app
        .get(&format!("/v1/sandboxes/{id}/egress-policy"), token)
        .await
        .body;
    assert_eq!(
        policy["allow"],
        json!([
            "allowed.test.example",
            "loopback.test.example",
            "metadata.test.example",
            "sibling.test.example",
            "node.test.example",
            "fleet.test.example"
        ])
    );
    let changed = app
        .request(
            reqwest::Method::PUT,
            &format!("/v1/sandboxes/{id}/egress-policy"),
            Some(token),
            Some(json!({ "allow": ["Denied.Test.Example"] })),
        )
        .await;
    assert_eq!(changed.status.as_u16(), 200, "{}", changed.body);
    assert_eq!(changed.body["allow"], json!(["denied.test.example"]));
    let answer = sh(
        app,
        token,
        id,
        &through_proxy("denied.test.example", "/now"),
    )
    .await;
    assert!(
        answer["stdout"].as_str().unwrap().contains("GET /now"),
        "{answer}"
    );
    let answer = sh(app, token, id, &through_proxy("allowed.test.example", "/")).await;
    assert!(
        answer["stdout"]
            .as_str()
            .unwrap()
            .starts_with("HTTP/1.1 403"),
        "{answer}"
    );
    app.request(
        reqwest::Method::PUT,
        &format!("/v1/sandboxes/{closed}/egress-policy"),
        Some(token),
        Some(json!({ "allow": ["allowed.test.example"] })),
    )
    .await
    .assert_error(409, "egress_not_enabled");
    let bob = &scene.bob;
    app.get(&format!("/v1/sandboxes/{id}/egress"), &bob.api_key.token)
        .await
        .assert_error(404, "not_found");
    app.request(
        reqwest::Method::PUT,
        &format!("/v1/sandboxes/{id}/egress-policy"),
        Some(&bob.api_key.token),
        Some(json!({ "allow": ["evil.example.com"] })),
    )
    .await
    .assert_error(404, "not_found");
}

/// A sandbox that asked for no egress has loopback only.
async fn without_egress_a_sandbox_has_loopback_only_and_policies_are_checked(scene: &Scene) {
    let (app, token, closed) = (&scene.app, scene.token.as_str(), &scene.closed);
    let answer = sh(
        app,
        token,
        closed,
        "env | grep -ci proxy; cat /proc/net/dev | grep -c eth0",
    )
    .await;
    assert_eq!(answer["stdout"], "0\n0\n", "{answer}");
    // Policies are validated: IP addresses are not patterns.
    app.post(
        "/v1/sandboxes",
        token,
        json!({ "egress": { "allow": ["203.0.113.2"] } }),
    )
    .await
    .assert_error(422, "invalid_request");
}

async fn the_team_default_policy_applies_to_sandboxes_that_name_none(scene: &Scene) {
    let (app, token) = (&scene.app, scene.token.as_str());
    let bob = &scene.bob;
    // The team's default policy: what sandboxes that say nothing about `egress` get.
    assert_eq!(app.get("/v1/egress-policy", token).await.body, Value::Null);
    let put_default = |body: Value| {
        app.request(
            reqwest::Method::PUT,
            "/v1/egress-policy",
            Some(token),
            Some(body),
        )
    };
    put_default(json!({ "allow": [] }))
        .await
        .assert_error(422, "invalid_request");
    put_default(json!({ "allow": ["203.0.113.2"] }))
        .await
        .assert_error(422, "invalid_request");
    let set = put_default(json!({ "allow": ["Allowed.test.example"] })).await;
    assert_eq!(set.status.as_u16(), 200, "{}", set.body);
    assert_eq!(set.body["allow"], json!(["allowed.test.example"]));
    assert_eq!(app.get("/v1/egress-policy", token).await.body, set.body);
    assert_eq!(
        app.get("/v1/egress-policy", &bob.api_key.token).await.body,
        Value::Null,
        "another team's default is its own"
    );
    let defaulted = create_ok(app, token, json!({})).await;
    let row = app
        .get(&format!("/v1/sandboxes/{defaulted}"), token)
        .await
        .body;
    assert_eq!(
        row["egress"]["allow"],
        json!(["allowed.test.example"]),
        "{row}"
    );
    let answer = sh(
        app,
        token,
        &defaulted,
        &through_proxy("allowed.test.example", "/default"),
    )
    .await;
    assert!(
        answer["stdout"].as_str().unwrap().contains("GET /default"),
        "{answer}"
    );
    // An explicit empty policy still means loopback only.
    let opted_out = create_ok(app, token, json!({ "egress": { "allow": [] } })).await;
    let row = app
        .get(&format!("/v1/sandboxes/{opted_out}"), token)
        .await
        .body;
    assert_eq!(row["egress"], Value::Null, "{row}");
    let audited = app
        .count("SELECT count(*) FROM audit_events WHERE action = 'egress_policy.set_default' AND target LIKE 'team:%'")
        .await;
    assert_eq!(audited, 1);
    let cleared = app.delete("/v1/egress-policy", token).await;
    assert_eq!(cleared.status.as_u16(), 204, "{}", cleared.body);
    let plain = create_ok(app, token, json!({})).await;
    let row = app.get(&format!("/v1/sandboxes/{plain}"), token).await.body;
    assert_eq!(row["egress"], Value::Null, "{row}");
    for sandbox in [&defaulted, &opted_out, &plain] {
        app.delete(&format!("/v1/sandboxes/{sandbox}"), token).await;
    }
}

/// Destroyed sandboxes leave no link behind.
async fn destroyed_sandboxes_leave_no_link_behind(scene: &Scene) {
    let (app, token, id, other, closed) = (
        &scene.app,
        scene.token.as_str(),
        &scene.id,
        &scene.other,
        &scene.closed,
    );
    for sandbox in [&id, &other, &closed] {
        app.delete(&format!("/v1/sandboxes/{sandbox}"), token).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(": sbh"), "{links}");
}

/// A worker with the `base` template and an egress network whose resolver sends the test's
/// names to the upstream (and one to loopback), trusting the upstream's CA.
pub fn credentials_worker(
    app: &crate::helpers::TestApp,
    upstream: &Upstream,
) -> sandbase_worker::service::ServiceConfig {
    let public = IpAddr::V4(upstream.address);
    let mut config = worker_config(app, "w", 4, 0);
    let tarball = std::env::var("SANDBASE_BASE_TARBALL")
        .expect("SANDBASE_BASE_TARBALL: the base root file system (scripts/setup builds it)");
    config
        .templates
        .push(("base".to_owned(), TemplateSource::Tarball(tarball.into())));
    config.node.egress = Some(EgressConfig {
        pool: "10.214.0.0".parse().unwrap(),
        proxy_port: proxy_ports(),
        resolver: Resolver::Fixed(HashMap::from([
            ("api.test.example".to_owned(), vec![public]),
            ("git.test.example".to_owned(), vec![public]),
            ("other.test.example".to_owned(), vec![public]),
            ("echo.test.example".to_owned(), vec![public]),
            ("denied.test.example".to_owned(), vec![public]),
            (
                "loopback.test.example".to_owned(),
                vec!["127.0.0.1".parse().unwrap()],
            ),
        ])),
        node_addresses: Vec::new(),
        denied_networks: Vec::new(),
        max_connections: 16,
        extra_ca: Some(upstream.ca_pem.clone().into_bytes()),
        proxy_program: proxy_program(),
        proxy_user: Some(PROXY_USER),
        // Long enough for the sandbox to try its luck while the proxy is down.
        restart_delay: Duration::from_secs(5),
    });
    config
}

async fn scene_get(app: &crate::helpers::TestApp, token: &str, id: &str) -> serde_json::Value {
    app.get(&format!("/v1/sandboxes/{id}"), token).await.body
}
