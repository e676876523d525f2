use reqwest::Method;
use serde_json::json;

use crate::helpers::{PASSWORD, email, spawn_app};

#[tokio::test]
async fn signup_returns_user_team_key_and_session_that_all_work() {
    let app = spawn_app().await;
    let address = email("founder");
    let signup = app.signup(&address, "Acme").await;
    assert_eq!(signup.user.email, address);
    assert_eq!(signup.team.name, "Acme");
    assert!(
        signup
            .api_key
            .token
            .starts_with(&format!("sb_{}_", signup.api_key.key.public_id))
    );

    let me = app.get("/v1/me", &signup.api_key.token).await;
    assert_eq!(me.status, 200, "{}", me.body);
    assert_eq!(me.body["team"]["id"], json!(signup.team.id));
    assert_eq!(me.body["role"], "owner");
    assert_eq!(me.body["auth"], "api_key");
    assert_eq!(me.body["user"]["email"], json!(address));

    let me = app.get("/v1/me", &signup.session.token).await;
    assert_eq!(me.status, 200, "{}", me.body);
    assert_eq!(me.body["auth"], "session");
    assert_eq!(me.body["team"]["id"], json!(signup.team.id));

    // The password is stored as an Argon2id hash, never as itself.
    let stored: String = sqlx::query_scalar("SELECT password_hash FROM users WHERE id = $1")
        .bind(signup.user.id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(stored.starts_with("$argon2id$"), "{stored}");
    assert!(!stored.contains(PASSWORD));
}

#[tokio::test]
async fn login_opens_a_session_for_the_chosen_team() {
    let app = spawn_app().await;
    let address = email("login");
    let signup = app.signup(&address, "First").await;
    let session = app.login(&address, None).await;
    let me = app.get("/v1/me", &session).await;
    assert_eq!(me.body["team"]["id"], json!(signup.team.id));

    // E-mail matching is case-insensitive.
    let answer = app
        .request(
            Method::POST,
            "/v1/auth/login",
            None,
            Some(json!({ "email": address.to_uppercase(), "password": PASSWORD })),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["teams"].as_array().map(Vec::len), Some(1));

    // A team the user is not in is not found.
    let answer = app
        .request(
            Method::POST,
            "/v1/auth/login",
            None,
            Some(
                json!({ "email": address, "password": PASSWORD, "team_id": uuid::Uuid::new_v4() }),
            ),
        )
        .await;
    answer.assert_error(404, "not_found");
}

#[tokio::test]
async fn wrong_password_and_unknown_email_get_the_same_answer() {
    let app = spawn_app().await;
    let address = email("victim");
    app.signup(&address, "Victims").await;
    for (login, password) in [
        (address.as_str(), "wrong password entirely"),
        ("nobody-here@example.com", PASSWORD),
    ] {
        let answer = app
            .request(
                Method::POST,
                "/v1/auth/login",
                None,
                Some(json!({ "email": login, "password": password })),
            )
            .await;
        answer.assert_error(401, "invalid_credentials");
    }
    // Both failures are in the audit log, with no team for the unknown address.
    let failures = app
        .count(
            "SELECT count(*) FROM audit_events WHERE action = 'auth.login' AND outcome = 'denied'",
        )
        .await;
    assert_eq!(failures, 2);
}
