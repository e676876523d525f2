//! What the dashboard needs from the gateway: its files served at `/` (the app's own paths
//! answered with `index.html`, hashed assets cached for good, a strict CSP, the API's 404s
//! unchanged), switching a session to another team, the audit log's details and outcome
//! filter.

use reqwest::{Method, StatusCode};
use serde_json::json;
use uuid::Uuid;

use crate::helpers::{TestApp, email, spawn_app, spawn_app_with};

const INDEX: &str = "<!doctype html><title>SandBase</title><script type=module src=/assets/index-abc123.js></script>";

async fn dashboard_app() -> TestApp {
    let root = std::env::temp_dir().join(format!("sandbase-web-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(root.join("assets")).unwrap();
    std::fs::write(root.join("index.html"), INDEX).unwrap();
    std::fs::write(root.join("assets/index-abc123.js"), "console.log(1)").unwrap();
    spawn_app_with(move |settings| settings.server.web_dir = Some(root)).await
}

async fn fetch(app: &TestApp, method: Method, path: &str) -> reqwest::Response {
    app.http
        .request(method, format!("{}{path}", app.address))
        .send()
        .await
        .unwrap()
}

fn header<'a>(answer: &'a reqwest::Response, name: &str) -> &'a str {
    answer
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_is_served_beside_the_api() {
    let app = dashboard_app().await;
    let host = app.address.trim_start_matches("http://").to_owned();
    for path in [
        "/",
        "/sandboxes/0190-abc",
        "/billing/success?session_id=cs_1",
    ] {
        let answer = fetch(&app, Method::GET, path).await;
        assert_eq!(answer.status(), StatusCode::OK, "{path}");
        assert_eq!(header(&answer, "cache-control"), "no-cache");
        assert!(header(&answer, "content-type").starts_with("text/html"));
        let policy = header(&answer, "content-security-policy").to_owned();
        assert!(policy.contains("script-src 'self'"), "{policy}");
        assert!(
            !policy.contains("script-src 'self' 'unsafe-inline'"),
            "{policy}"
        );
        assert!(
            policy.contains(&format!("connect-src 'self' ws://{host} wss://{host}")),
            "{policy}"
        );
        assert!(policy.contains("frame-ancestors 'none'"));
        assert_eq!(header(&answer, "x-content-type-options"), "nosniff");
        assert_eq!(answer.text().await.unwrap(), INDEX);
    }
    let asset = fetch(&app, Method::GET, "/assets/index-abc123.js").await;
    assert_eq!(asset.status(), StatusCode::OK);
    assert_eq!(
        header(&asset, "cache-control"),
        "public, max-age=31536000, immutable"
    );
    assert!(header(&asset, "content-type").starts_with("text/javascript"));
    let head = fetch(&app, Method::HEAD, "/assets/index-abc123.js").await;
    assert_eq!(head.status(), StatusCode::OK);
    // A missing asset is a 404, not the app; a path outside the files is never read.
    assert_eq!(
        fetch(&app, Method::GET, "/assets/gone-1.js").await.status(),
        StatusCode::NOT_FOUND
    );
    let climbed = fetch(&app, Method::GET, "/../../etc/passwd").await;
    assert_eq!(climbed.text().await.unwrap(), INDEX);
    assert_eq!(
        fetch(&app, Method::GET, "/%2e%2e/%2e%2e/etc/hostname.txt")
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    // The API's own paths keep their JSON errors.
    let unknown = app
        .request(Method::GET, "/v1/nothing-here", None, None)
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.body["error"]["code"], "route_not_found");
    // No OAuth metadata is published: an MCP client that found some would stop sending the
    // static bearer header it was configured with.
    for discovery in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
    ] {
        let answer = app.request(Method::GET, discovery, None, None).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{discovery}");
        assert_eq!(answer.body["error"]["code"], "route_not_found");
    }
    let posted = app
        .request(Method::POST, "/keys", None, Some(json!({})))
        .await;
    assert_eq!(posted.status, StatusCode::NOT_FOUND);
    assert_eq!(posted.body["error"]["code"], "route_not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_dashboard_every_unknown_path_is_the_api_s_404() {
    let app = spawn_app().await;
    let answer = app.request(Method::GET, "/", None, None).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.body["error"]["code"], "route_not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_switches_to_another_of_its_user_s_teams_only() {
    let app = spawn_app().await;
    let (owner, member, stranger) = (email("owner"), email("member"), email("stranger"));
    let owners = app.signup(&owner, "Owners").await;
    let members = app.signup(&member, "Own team").await;
    let strangers = app.signup(&stranger, "Strangers").await;
    app.add_member(&owners.session.token, &member, "member")
        .await;

    let session = app.login(&member, Some(members.team.id)).await;
    let switched = app
        .post(
            "/v1/auth/switch",
            &session,
            json!({ "team_id": owners.team.id }),
        )
        .await;
    assert_eq!(switched.status, StatusCode::OK, "{}", switched.body);
    assert_eq!(switched.body["team"]["id"], owners.team.id.to_string());
    assert_eq!(switched.body["role"], "member");
    assert_eq!(switched.body["teams"].as_array().unwrap().len(), 2);
    let token = switched.body["session"]["token"].as_str().unwrap();
    let me = app.get("/v1/me", token).await;
    assert_eq!(me.body["team"]["id"], owners.team.id.to_string());
    assert_eq!(me.body["role"], "member");

    // Not a team of the user's; an API key; no session at all.
    let foreign = app
        .post(
            "/v1/auth/switch",
            &session,
            json!({ "team_id": strangers.team.id }),
        )
        .await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);
    let by_key = app
        .post(
            "/v1/auth/switch",
            &members.api_key.token,
            json!({ "team_id": owners.team.id }),
        )
        .await;
    assert_eq!(by_key.status, StatusCode::FORBIDDEN);
    assert_eq!(by_key.body["error"]["code"], "forbidden");
    let anonymous = app
        .request(
            Method::POST,
            "/v1/auth/switch",
            None,
            Some(json!({ "team_id": owners.team.id })),
        )
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM audit_events WHERE action = 'auth.switch' AND team_id = '{}'",
            owners.team.id
        ))
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_log_has_details_and_filters_by_outcome() {
    let app = spawn_app().await;
    let owner = app.signup(&email("auditor"), "Audited").await;
    let token = &owner.session.token;
    let invited = email("invited");
    app.post(
        "/v1/team/members",
        token,
        json!({ "email": invited, "role": "member" }),
    )
    .await;
    // A refused call: a failure row.
    let refused = app.post("/v1/api-keys", token, json!({ "name": "" })).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);

    let page = app.get("/v1/audit?action=member.invite", token).await;
    assert_eq!(page.body["items"][0]["details"]["email"], invited);
    for outcome in ["success", "failure"] {
        let page = app
            .get(&format!("/v1/audit?outcome={outcome}"), token)
            .await;
        assert_eq!(page.status, StatusCode::OK);
        let items = page.body["items"].as_array().unwrap();
        assert!(!items.is_empty(), "{outcome}");
        assert!(items.iter().all(|item| item["outcome"] == outcome));
    }
    let bad = app.get("/v1/audit?outcome=maybe", token).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad.body["error"]["code"], "invalid_request");
}
