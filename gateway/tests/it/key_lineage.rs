//! Keys made by keys are their children: never more rights, money or time than the parent,
//! revoked with it, and their spending counted against it. Each test performs the attack a
//! hostile holder of a capped, short-lived key would try, and checks it fails while the
//! team's other keys keep working.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, email, spawn_app};

fn expiry(key: &Value) -> Option<DateTime<Utc>> {
    key["expires_at"].as_str().map(|at| at.parse().unwrap())
}

/// Waits (up to 2 s, the usual invalidation time) for `token` to be refused as revoked.
async fn refused_soon(app: &TestApp, token: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let answer = app.get("/v1/me", token).await;
        if answer.status == StatusCode::UNAUTHORIZED {
            assert_eq!(answer.code(), "api_key_revoked", "{}", answer.body);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the key still works: {}",
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A capped, expiring key handed to an agent tries to mint a full team key: no cap, no
/// expiry, a higher cap or a later expiry. Its children get at most what it has.
#[tokio::test]
async fn a_key_cannot_mint_a_key_with_more_money_or_time_than_itself() {
    let app = spawn_app().await;
    let owner = app.signup(&email("lineage"), "Lineage").await;
    let owner_token = owner.api_key.token.as_str();
    let parent = app
        .post(
            "/v1/api-keys",
            owner_token,
            json!({ "name": "agent", "role": "member", "max_credits": "1", "expires_in_secs": 3600 }),
        )
        .await;
    assert_eq!(parent.status, StatusCode::CREATED, "{}", parent.body);
    let parent_token = parent.body["token"].as_str().unwrap().to_owned();
    let parent_expiry = expiry(&parent.body).unwrap();

    // Asking for nothing: the child inherits the parent's cap and expiry.
    let child = app
        .post("/v1/api-keys", &parent_token, json!({ "name": "child" }))
        .await;
    assert_eq!(child.status, StatusCode::CREATED, "{}", child.body);
    assert_eq!(child.body["max_credits_micro"], 1_000_000, "{}", child.body);
    assert!(
        expiry(&child.body).is_some_and(|at| at <= parent_expiry),
        "{}",
        child.body
    );
    assert_eq!(child.body["role"], "member");
    // Asking for more: refused.
    for (body, why) in [
        (
            json!({ "name": "rich", "max_credits": "5" }),
            "a higher cap",
        ),
        (
            json!({ "name": "late", "expires_in_secs": 7200 }),
            "a later expiry",
        ),
        (json!({ "name": "boss", "role": "admin" }), "a higher role"),
    ] {
        let answer = app.post("/v1/api-keys", &parent_token, body).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{why}: {}",
            answer.body
        );
    }
    // A grandchild is held by its grandparent too: revoking the parent revokes both.
    let child_token = child.body["token"].as_str().unwrap().to_owned();
    let (_, grandchild) = app
        .create_key(&child_token, json!({ "name": "grandchild" }))
        .await;
    assert_eq!(app.get("/v1/me", &grandchild).await.status, StatusCode::OK);
    let parent_id = parent.body["id"].as_str().unwrap();
    let revoked = app
        .delete(&format!("/v1/api-keys/{parent_id}"), owner_token)
        .await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT);
    refused_soon(&app, &child_token).await;
    refused_soon(&app, &grandchild).await;
    // The team's own key keeps working.
    assert_eq!(app.get("/v1/me", owner_token).await.status, StatusCode::OK);
}

/// A member's key (made by the owner) tries to revoke the owner's sign-up key, which the
/// same user created: who may revoke follows roles and lineage, not the creating user.
#[tokio::test]
async fn a_member_key_cannot_revoke_keys_outside_its_own_lineage() {
    let app = spawn_app().await;
    let owner = app.signup(&email("revoke"), "Revoke").await;
    let owner_token = owner.api_key.token.as_str();
    let (_, member_key) = app
        .create_key(owner_token, json!({ "name": "ci", "role": "member" }))
        .await;
    let (sibling_id, sibling) = app
        .create_key(owner_token, json!({ "name": "other", "role": "member" }))
        .await;
    for target in [owner.api_key.key.id, sibling_id] {
        let answer = app
            .delete(&format!("/v1/api-keys/{target}"), &member_key)
            .await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    }
    assert_eq!(app.get("/v1/me", owner_token).await.status, StatusCode::OK);
    assert_eq!(app.get("/v1/me", &sibling).await.status, StatusCode::OK);
    // Its own children it may revoke, and itself.
    let (child_id, child) = app
        .create_key(&member_key, json!({ "name": "child" }))
        .await;
    let answer = app
        .delete(&format!("/v1/api-keys/{child_id}"), &member_key)
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{}", answer.body);
    refused_soon(&app, &child).await;
    // An admin key may revoke a member's key, but not the owner's.
    let (_, admin_key) = app
        .create_key(owner_token, json!({ "name": "admin", "role": "admin" }))
        .await;
    let answer = app
        .delete(
            &format!("/v1/api-keys/{}", owner.api_key.key.id),
            &admin_key,
        )
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    let answer = app
        .delete(&format!("/v1/api-keys/{sibling_id}"), &admin_key)
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{}", answer.body);
    assert_eq!(app.get("/v1/me", owner_token).await.status, StatusCode::OK);
}

/// A key given to an agent or a CI job takes what it started with it: revoking the key (or
/// its running out) stops the sandboxes it made, with the reason, while the team's other
/// sandboxes keep running.
#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_stop_with_the_key_that_made_them() {
    use crate::testbed::{TestWorker, create_ok, sandbox_app, wait_until, worker_config};
    let app = sandbox_app().await;
    let worker = TestWorker::start(worker_config(&app, "kr", 4, 0)).await;
    let owner = app.signup(&email("keyend"), "Keyend").await;
    let token = owner.api_key.token.as_str();
    let (agent_id, agent) = app.create_key(token, json!({ "name": "agent" })).await;
    let (_, short) = app
        .create_key(token, json!({ "name": "short", "expires_in_secs": 3 }))
        .await;
    let by_agent = create_ok(&app, &agent, json!({})).await;
    let by_short = create_ok(&app, &short, json!({})).await;
    let by_owner = create_ok(&app, token, json!({})).await;
    app.delete(&format!("/v1/api-keys/{agent_id}"), token).await;
    let state_of = |id: String| {
        let app = &app;
        async move { app.get(&format!("/v1/sandboxes/{id}"), token).await.body }
    };
    for stopped in [&by_agent, &by_short] {
        wait_until(
            "the key's sandbox to stop",
            std::time::Duration::from_secs(20),
            || async { state_of(stopped.clone()).await["state"] == "stopped" },
        )
        .await;
        assert_eq!(
            state_of(stopped.clone()).await["stop_reason"],
            "key_revoked"
        );
    }
    assert_eq!(state_of(by_owner.clone()).await["state"], "running");
    let audited = app
        .count("SELECT count(*) FROM audit_events WHERE action = 'sandbox.stop_key_revoked'")
        .await;
    assert_eq!(audited, 2);
    worker.clean_up().await;
}
