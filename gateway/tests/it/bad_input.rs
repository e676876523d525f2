//! Bad input gets a clear 4xx with a stable code, and nothing is half-written.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use reqwest::Method;
use secrecy::ExposeSecret;
use serde_json::json;
use sha2::Sha256;

use crate::helpers::{TestApp, email, spawn_app};

async fn row_counts(app: &TestApp) -> (i64, i64, i64, i64) {
    (
        app.count("SELECT count(*) FROM users").await,
        app.count("SELECT count(*) FROM teams").await,
        app.count("SELECT count(*) FROM team_members").await,
        app.count("SELECT count(*) FROM api_keys").await,
    )
}

#[tokio::test]
async fn malformed_signups_are_refused_and_write_nothing() {
    let app = spawn_app().await;
    let taken = email("taken");
    app.signup(&taken, "Existing").await;
    let before = row_counts(&app).await;

    let cases: Vec<(&str, Vec<u8>, &str, u16, &str)> = vec![
        (
            "not json",
            b"{\"email\": ".to_vec(),
            "application/json",
            400,
            "invalid_json",
        ),
        (
            "wrong type",
            b"[1,2,3]".to_vec(),
            "application/json",
            422,
            "invalid_request",
        ),
        (
            "missing fields",
            br#"{"email":"x@example.com"}"#.to_vec(),
            "application/json",
            422,
            "invalid_request",
        ),
        (
            "not json content",
            b"email=x".to_vec(),
            "application/x-www-form-urlencoded",
            415,
            "unsupported_media_type",
        ),
        (
            "too large",
            vec![b' '; 2 * 1024 * 1024],
            "application/json",
            413,
            "payload_too_large",
        ),
    ];
    for (name, body, content_type, status, code) in cases {
        let answer = app
            .post_raw("/v1/auth/signup", None, content_type, body)
            .await;
        assert_eq!(
            (answer.status.as_u16(), answer.code()),
            (status, code),
            "case {name}: {}",
            answer.body
        );
    }

    for (name, body, code) in [
        (
            "bad e-mail",
            json!({ "email": "not-an-email", "password": "long enough password", "team_name": "T" }),
            "invalid_request",
        ),
        (
            "short password",
            json!({ "email": email("short"), "password": "short", "team_name": "T" }),
            "invalid_request",
        ),
        (
            "empty team",
            json!({ "email": email("noteam"), "password": "long enough password", "team_name": "  " }),
            "invalid_request",
        ),
        (
            "long team",
            json!({ "email": email("longteam"), "password": "long enough password", "team_name": "x".repeat(101) }),
            "invalid_request",
        ),
    ] {
        let answer = app
            .request(Method::POST, "/v1/auth/signup", None, Some(body))
            .await;
        assert_eq!(
            (answer.status.as_u16(), answer.code()),
            (422, code),
            "case {name}: {}",
            answer.body
        );
    }

    // Duplicate e-mail, in another case: refused, and no team or key was created for it.
    let answer = app
        .request(
            Method::POST,
            "/v1/auth/signup",
            None,
            Some(json!({ "email": taken.to_uppercase(), "password": "long enough password", "team_name": "Dup" })),
        )
        .await;
    answer.assert_error(409, "email_taken");
    assert_eq!(
        row_counts(&app).await,
        before,
        "a refused sign-up left rows behind"
    );
}

#[tokio::test]
async fn bad_credentials_get_distinct_clear_errors() {
    let app = spawn_app().await;
    let owner = app.signup(&email("creds"), "Creds").await;
    let good = owner.api_key.token.clone();
    let public_id = owner.api_key.key.public_id.clone();

    let no_auth = app.request(Method::GET, "/v1/me", None, None).await;
    no_auth.assert_error(401, "unauthenticated");
    assert!(no_auth.headers.contains_key("www-authenticate"));
    for (token, code) in [
        ("sb_short_x", "invalid_api_key"),
        ("not-a-key-at-all", "invalid_api_key"),
        (
            "sb_zzzzzzzzzzzzzzzz_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "invalid_api_key",
        ),
        // The right public id with a wrong secret says nothing more than an unknown key.
        (
            &format!("sb_{public_id}_{}", "a".repeat(40)),
            "invalid_api_key",
        ),
        ("eyJhbGciOiJIUzI1NiJ9.e30.c2ln", "invalid_session"),
    ] {
        app.get("/v1/me", token).await.assert_error(401, code);
    }

    // A session token with a tampered payload (another team) fails its signature.
    let session = owner.session.token.clone();
    let mut parts: Vec<String> = session.split('.').map(str::to_owned).collect();
    let mut claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(&parts[1]).unwrap()).unwrap();
    claims["team"] = json!(uuid::Uuid::new_v4());
    parts[1] = URL_SAFE_NO_PAD.encode(claims.to_string());
    app.get("/v1/me", &parts.join("."))
        .await
        .assert_error(401, "invalid_session");

    // A correctly signed but expired session.
    let secret = app
        .settings
        .auth
        .jwt_secret
        .as_ref()
        .unwrap()
        .expose_secret()
        .to_owned();
    claims["team"] = json!(owner.team.id);
    claims["iat"] = json!(chrono::Utc::now().timestamp() - 7200);
    claims["exp"] = json!(chrono::Utc::now().timestamp() - 3600);
    let expired = sign(&secret, &claims);
    app.get("/v1/me", &expired)
        .await
        .assert_error(401, "session_expired");
    // The same, still valid, is accepted: the signing above matches the gateway's.
    claims["exp"] = json!(chrono::Utc::now().timestamp() + 3600);
    assert_eq!(app.get("/v1/me", &sign(&secret, &claims)).await.status, 200);

    // None of this disturbed the good key.
    assert_eq!(app.get("/v1/me", &good).await.status, 200);
}

fn sign(secret: &str, claims: &serde_json::Value) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(input.as_bytes());
    format!(
        "{input}.{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

#[tokio::test]
async fn unknown_routes_methods_and_ids_are_explained() {
    let app = spawn_app().await;
    let owner = app.signup(&email("routes"), "Routes").await;
    let key = owner.api_key.token.as_str();
    app.get("/v1/nothing-here", key)
        .await
        .assert_error(404, "route_not_found");
    app.request(Method::PUT, "/v1/me", Some(key), None)
        .await
        .assert_error(405, "method_not_allowed");
    app.get("/v1/api-keys/not-a-uuid", key)
        .await
        .assert_error(404, "not_found");
    // A WebSocket route asked as plain HTTP explains itself in the error shape (it was
    // axum's plain-text 400).
    let attach = format!("/v1/sandboxes/{}/pty/1/attach", uuid::Uuid::new_v4());
    let plain = app.get(&attach, key).await;
    plain.assert_error(426, "websocket_required");
    app.get(&format!("/v1/api-keys/{}", uuid::Uuid::new_v4()), key)
        .await
        .assert_error(404, "not_found");
    app.post(
        "/v1/api-keys",
        key,
        json!({ "name": "x", "role": "emperor" }),
    )
    .await
    .assert_error(422, "invalid_request");
    app.post(
        "/v1/api-keys",
        key,
        json!({ "name": "x", "unexpected": true }),
    )
    .await
    .assert_error(422, "invalid_request");
}
