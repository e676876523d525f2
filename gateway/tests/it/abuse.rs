//! Anonymous abuse of sign-up and login: one address (or one network) signing up again and
//! again for starter credits, or guessing passwords, is refused with 429 and `Retry-After`,
//! while other addresses are served as before.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, email, spawn_app_with};

/// A gateway with the default sign-up and login limits, trusting `X-Forwarded-For` so the
/// test can speak from several addresses.
async fn abuse_app() -> TestApp {
    spawn_app_with(|settings| {
        let defaults = sandbase_gateway::Settings::default();
        settings.auth.signups_per_hour = defaults.auth.signups_per_hour;
        settings.auth.logins_per_minute = defaults.auth.logins_per_minute;
        settings.server.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    })
    .await
}

/// POST `body` to `path` as if from `address`: the status, `Retry-After`, and the body.
async fn post_from(
    app: &TestApp,
    address: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Option<String>, Value) {
    let response = app
        .http
        .post(format!("{}{path}", app.address))
        .header("x-forwarded-for", address)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap().to_owned());
    (
        status,
        retry_after,
        response.json().await.unwrap_or(Value::Null),
    )
}

async fn signup_from(app: &TestApp, address: &str) -> (StatusCode, Option<String>, Value) {
    let body = json!({ "email": email("faucet"), "password": "a long password 123", "team_name": "Faucet" });
    post_from(app, address, "/v1/auth/signup", body).await
}

#[tokio::test]
async fn one_address_cannot_sign_up_for_starter_credits_again_and_again() {
    let app = abuse_app().await;
    let limit = sandbase_gateway::Settings::default().auth.signups_per_hour;
    assert!(limit <= 10, "the default is no looser than 10 an hour");
    for _ in 0..limit {
        let (status, _, body) = signup_from(&app, "203.0.113.7").await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, retry_after, body) = signup_from(&app, "203.0.113.7").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited");
    assert!(retry_after.unwrap().parse::<u64>().unwrap() >= 1);
    // Another address is served as before.
    let (status, _, body) = signup_from(&app, "198.51.100.9").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Rotating addresses within one /24 runs into the network's own limit.
    let mut admitted = limit + 1;
    let mut refused = 0;
    for host in 8..(8 + 4 * limit) {
        match signup_from(&app, &format!("203.0.113.{host}")).await.0 {
            StatusCode::CREATED => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("{other}"),
        }
    }
    assert!(refused > 0, "a /24 signed up {admitted} times");
    assert!(
        admitted <= 3 * limit + 1,
        "a /24 signed up {admitted} times"
    );
    // IPv6: the addresses of one /64 are one address.
    for host in 1..=limit {
        let (status, _, body) = signup_from(&app, &format!("2001:db8:1:2::{host:x}")).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, _, _) = signup_from(&app, "2001:db8:1:2:ffff::1").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn one_address_cannot_guess_passwords_without_limit() {
    let app = abuse_app().await;
    let owner = email("owner");
    app.signup(&owner, "Owner").await;
    let limit = sandbase_gateway::Settings::default().auth.logins_per_minute;
    assert!(limit <= 30, "the default is no looser than 30 a minute");
    let guess = json!({ "email": owner, "password": "not the password" });
    // Twice the limit at once: the limiter decides as they arrive, before any password is
    // checked, so a slow hash under load cannot let the bucket refill between guesses. It
    // refills evenly over the minute (one guess every 60/limit seconds): the guesses
    // allowed are the limit plus what refilled while they were decided.
    let started = std::time::Instant::now();
    let guesses = (0..2 * limit).map(|_| {
        let guess = guess.clone();
        let app = &app;
        async move { post_from(app, "203.0.113.50", "/v1/auth/login", guess).await }
    });
    let answers = futures_util::future::join_all(guesses).await;
    let elapsed = started.elapsed();
    let mut admitted = 0;
    for (status, retry_after, body) in answers {
        match status {
            // Past the limiter: a wrong password, or too many hashes at once (503 `busy`).
            StatusCode::UNAUTHORIZED | StatusCode::SERVICE_UNAVAILABLE => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(retry_after.is_some(), "429 without Retry-After");
            }
            other => panic!("{other}: {body}"),
        }
    }
    let refilled = (elapsed.as_secs_f64() / (60.0 / f64::from(limit))).ceil() as u32;
    assert!(
        admitted >= limit && admitted <= limit + refilled && admitted < 2 * limit,
        "{admitted} of {} guesses admitted in {elapsed:?}",
        2 * limit
    );
    // The owner, elsewhere, still logs in.
    let right = json!({ "email": owner, "password": "correct horse battery staple" });
    let (status, _, body) = post_from(&app, "198.51.100.20", "/v1/auth/login", right).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A flood of requests with a bogus key must not become a flood of audit rows: the first
/// failure of an address and credential is written at once, the rest of its window as one
/// row with their count.
#[tokio::test]
async fn failed_authentications_are_audited_in_aggregate() {
    let app = spawn_app_with(|settings| settings.auth.failed_auth_window_secs = 2).await;
    let owner = app.signup(&email("flooded"), "Flooded").await;
    let bogus = "sb_aaaaaaaaaaaaaaaa_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    let failed_rows = "SELECT count(*) FROM audit_events WHERE action = 'auth.failed'";
    for _ in 0..300 {
        app.get("/v1/me", bogus)
            .await
            .assert_error(401, "invalid_api_key");
    }
    assert_eq!(app.count(failed_rows).await, 1, "one row at once");
    // Once the window is over, one more row carries the rest.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while app.count(failed_rows).await < 2 {
        assert!(std::time::Instant::now() < deadline, "no summary row");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(app.count(failed_rows).await, 2);
    let (count, credential): (i64, String) = sqlx::query_as(
        "SELECT (details->>'count')::bigint, details->>'credential' FROM audit_events \
         WHERE action = 'auth.failed' ORDER BY occurred_at DESC, id DESC LIMIT 1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!((count, credential.as_str()), (299, "sb_aaaaaaaaaaaaaaaa"));
    // The team's own key is served all along.
    assert_eq!(
        app.get("/v1/me", &owner.api_key.token).await.status,
        StatusCode::OK
    );
}
