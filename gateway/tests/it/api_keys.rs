use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::helpers::{email, spawn_app, spawn_with_settings};

#[tokio::test]
async fn keys_are_created_listed_read_and_revoked_without_showing_secrets() {
    let app = spawn_app().await;
    let signup = app.signup(&email("keys"), "Keys").await;
    let owner = signup.api_key.token.as_str();

    let created = app
        .post(
            "/v1/api-keys",
            owner,
            json!({ "name": "ci", "role": "member", "expires_in_secs": 3600 }),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let token = created.body["token"].as_str().unwrap().to_owned();
    let id = created.body["id"].as_str().unwrap().to_owned();
    assert_eq!(created.body["role"], "member");
    assert!(created.body["expires_at"].is_string());

    // The new key works, with its own role.
    let me = app.get("/v1/me", &token).await;
    assert_eq!(me.status, 200);
    assert_eq!(me.body["role"], "member");

    // Listing and reading show metadata, never the token or its hash.
    let list = app.get("/v1/api-keys", owner).await;
    assert_eq!(list.status, 200);
    let items = list.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    let text = list.body.to_string();
    let secret = token.rsplit('_').next().unwrap();
    assert!(!text.contains(secret));
    assert!(!text.contains("token") && !text.contains("hash"), "{text}");
    let one = app.get(&format!("/v1/api-keys/{id}"), owner).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.body["name"], "ci");
    assert!(one.body.get("token").is_none());

    // Only the SHA-256 of the secret is stored.
    let stored: Vec<u8> =
        sqlx::query_scalar("SELECT secret_hash FROM api_keys WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(stored, Sha256::digest(secret.as_bytes()).to_vec());

    // Revoked: the key stops working at once and leaves the list.
    let revoked = app.delete(&format!("/v1/api-keys/{id}"), owner).await;
    assert_eq!(revoked.status, 204);
    app.get("/v1/me", &token)
        .await
        .assert_error(401, "api_key_revoked");
    let list = app.get("/v1/api-keys", owner).await;
    assert_eq!(list.body["items"].as_array().unwrap().len(), 1);
    app.delete(&format!("/v1/api-keys/{id}"), owner)
        .await
        .assert_error(404, "not_found");
    app.get(&format!("/v1/api-keys/{id}"), owner)
        .await
        .assert_error(404, "not_found");
}

#[tokio::test]
async fn a_key_cannot_be_created_above_its_creators_role() {
    let app = spawn_app().await;
    let signup = app.signup(&email("roles"), "Roles").await;
    let (_, member_key) = app
        .create_key(
            &signup.api_key.token,
            json!({ "name": "member", "role": "member" }),
        )
        .await;
    app.post(
        "/v1/api-keys",
        &member_key,
        json!({ "name": "escalate", "role": "owner" }),
    )
    .await
    .assert_error(403, "forbidden");
    // Without a role the new key inherits the caller's.
    let (_, child) = app
        .create_key(&member_key, json!({ "name": "child" }))
        .await;
    assert_eq!(app.get("/v1/me", &child).await.body["role"], "member");
}

#[tokio::test]
async fn an_expired_key_is_refused() {
    let app = spawn_app().await;
    let signup = app.signup(&email("expiry"), "Expiry").await;
    let (_, token) = app
        .create_key(
            &signup.api_key.token,
            json!({ "name": "short", "expires_in_secs": 1 }),
        )
        .await;
    assert_eq!(app.get("/v1/me", &token).await.status, 200);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    app.get("/v1/me", &token)
        .await
        .assert_error(401, "api_key_expired");
    // Expiry in the past, or both forms at once, are refused.
    app.post(
        "/v1/api-keys",
        &signup.api_key.token,
        json!({ "name": "x", "expires_at": "2001-01-01T00:00:00Z" }),
    )
    .await
    .assert_error(422, "invalid_request");
    app.post(
        "/v1/api-keys",
        &signup.api_key.token,
        json!({ "name": "x", "expires_at": "2999-01-01T00:00:00Z", "expires_in_secs": 5 }),
    )
    .await
    .assert_error(422, "invalid_request");
}

#[tokio::test]
async fn revocation_reaches_every_gateway_within_a_second() {
    let first = spawn_app().await;
    // A second replica: same database, same Redis prefix.
    let second = spawn_with_settings(first.settings.clone()).await;
    let signup = first.signup(&email("replicas"), "Replicas").await;
    let (id, token) = first
        .create_key(&signup.api_key.token, json!({ "name": "shared" }))
        .await;
    // Warm both caches.
    for app in [&first, &second] {
        for _ in 0..3 {
            assert_eq!(app.get("/v1/me", &token).await.status, 200);
        }
    }
    let revoked_at = Instant::now();
    assert_eq!(
        first
            .delete(&format!("/v1/api-keys/{id}"), &signup.api_key.token)
            .await
            .status,
        204
    );
    loop {
        let answer = second.get("/v1/me", &token).await;
        if answer.status == 401 {
            answer.assert_error(401, "api_key_revoked");
            break;
        }
        assert!(
            revoked_at.elapsed() < Duration::from_secs(1),
            "the second gateway still accepted a revoked key after one second"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "revocation seen by the second gateway after {:?}",
        revoked_at.elapsed()
    );
}

#[tokio::test]
async fn last_used_is_recorded_without_blocking_requests() {
    let app = spawn_app().await;
    let signup = app.signup(&email("lastused"), "LastUsed").await;
    let id = signup.api_key.key.id;
    assert!(signup.api_key.key.last_used_at.is_none());
    assert_eq!(app.get("/v1/me", &signup.api_key.token).await.status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = app
            .get(&format!("/v1/api-keys/{id}"), &signup.session.token)
            .await;
        if answer.body["last_used_at"].is_string() {
            break;
        }
        assert!(Instant::now() < deadline, "last_used_at was never written");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
