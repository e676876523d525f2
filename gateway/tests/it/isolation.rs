//! Two teams: nothing of one is visible to, or changeable by, the other.

use serde_json::json;

use crate::helpers::{email, spawn_app};

#[tokio::test]
async fn a_team_cannot_see_or_touch_another_teams_keys_members_or_audit() {
    let app = spawn_app().await;
    let alice = app.signup(&email("alice"), "Alpha").await;
    let mallory = app.signup(&email("mallory"), "Mallet").await;
    let (alice_key_id, alice_extra) = app
        .create_key(&alice.api_key.token, json!({ "name": "alpha-ci" }))
        .await;
    let alice_audit_id = app.get("/v1/audit", &alice.api_key.token).await.body["items"][0]["id"]
        .as_i64()
        .unwrap();

    for token in [
        mallory.api_key.token.as_str(),
        mallory.session.token.as_str(),
    ] {
        // Reads by id.
        app.get(&format!("/v1/api-keys/{alice_key_id}"), token)
            .await
            .assert_error(404, "not_found");
        app.get(&format!("/v1/team/members/{}", alice.user.id), token)
            .await
            .assert_error(404, "not_found");
        app.get(&format!("/v1/audit/{alice_audit_id}"), token)
            .await
            .assert_error(404, "not_found");
        // Writes by id.
        app.delete(&format!("/v1/api-keys/{alice_key_id}"), token)
            .await
            .assert_error(404, "not_found");
        app.patch(
            &format!("/v1/team/members/{}", alice.user.id),
            token,
            json!({ "role": "member" }),
        )
        .await
        .assert_error(404, "not_found");
        app.delete(&format!("/v1/team/members/{}", alice.user.id), token)
            .await
            .assert_error(404, "not_found");
        // Lists never show them.
        let keys = app.get("/v1/api-keys", token).await.body.to_string();
        assert!(
            !keys.contains(&alice_key_id.to_string())
                && !keys.contains(&alice.api_key.key.public_id)
        );
        let members = app.get("/v1/team/members", token).await.body.to_string();
        assert!(!members.contains(&alice.user.id.to_string()));
        let audit = app.get("/v1/audit?limit=500", token).await;
        assert_eq!(audit.status, 200);
        for event in audit.body["items"].as_array().unwrap() {
            assert_eq!(
                event["team_id"],
                json!(mallory.team.id),
                "foreign audit row: {event}"
            );
        }
        let audit_by_actor = app
            .get(&format!("/v1/audit?actor={}", alice.user.id), token)
            .await;
        assert_eq!(audit_by_actor.body["items"].as_array().unwrap().len(), 0);
    }

    // A session cannot be pointed at another team.
    let answer = app
        .request(
            reqwest::Method::POST,
            "/v1/auth/login",
            None,
            Some(json!({ "email": mallory.user.email, "password": crate::helpers::PASSWORD, "team_id": alice.team.id })),
        )
        .await;
    answer.assert_error(404, "not_found");

    // Alice's things are all still there and working.
    assert_eq!(app.get("/v1/me", &alice_extra).await.status, 200);
    assert_eq!(
        app.get(
            &format!("/v1/api-keys/{alice_key_id}"),
            &alice.api_key.token
        )
        .await
        .status,
        200
    );
    let members = app.get("/v1/team/members", &alice.api_key.token).await;
    assert_eq!(members.body["items"][0]["role"], "owner");
}

/// A terminal opened on a sandbox id that is not the caller's — another team's, or none at
/// all — is 404, and leaves no recording row behind (found by the OpenAPI fuzzer: the row
/// was written before the sandbox was looked up, a missing sandbox was a 500).
#[tokio::test]
async fn a_terminal_on_a_sandbox_that_is_not_yours_is_not_found_and_records_nothing() {
    let app = spawn_app().await;
    let alice = app.signup(&email("alice"), "Alpha").await;
    let mallory = app.signup(&email("mallory"), "Mallet").await;
    let theirs = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO sandboxes (id, team_id, template, state, cwd, cpu_millis, memory_mb, \
           disk_mb, pids, expires_at) \
         VALUES ($1, $2, 'base', 'running', '/work', 1000, 512, 1024, 256, now() + interval '1 hour')",
    )
    .bind(theirs)
    .bind(alice.team.id)
    .execute(&app.db)
    .await
    .unwrap();
    for id in [theirs, uuid::Uuid::now_v7()] {
        let answer = app
            .post(
                &format!("/v1/sandboxes/{id}/pty"),
                &mallory.api_key.token,
                json!({}),
            )
            .await;
        answer.assert_error(404, "not_found");
    }
    // The owner's own terminal with a NUL in its command is refused before anything is
    // written (a recording keeps the command as JSON text, which cannot hold NUL: it was a 500).
    app.post(
        &format!("/v1/sandboxes/{theirs}/pty"),
        &alice.api_key.token,
        json!({ "cmd": ["sh", "-c", "echo\0"] }),
    )
    .await
    .assert_error(422, "invalid_request");
    assert_eq!(app.count("SELECT count(*) FROM recordings").await, 0);
}
