use std::collections::HashSet;

use serde_json::json;

use crate::helpers::{email, spawn_app};

#[tokio::test]
async fn mutations_and_failed_authentications_are_recorded() {
    let app = spawn_app().await;
    let owner = app.signup(&email("audited"), "Audited").await;
    let key = owner.api_key.token.as_str();
    let (key_id, token) = app.create_key(key, json!({ "name": "temp" })).await;
    app.delete(&format!("/v1/api-keys/{key_id}"), key).await;
    // A failed authentication with the revoked key, a refused mutation, and an anonymous failure.
    app.get("/v1/me", &token)
        .await
        .assert_error(401, "api_key_revoked");
    app.post("/v1/api-keys", key, json!({ "name": "" }))
        .await
        .assert_error(422, "invalid_request");
    app.get(
        "/v1/me",
        "sb_aaaaaaaaaaaaaaaa_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
    )
    .await
    .assert_error(401, "invalid_api_key");

    let page = app.get("/v1/audit?limit=100", key).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let events = page.body["items"].as_array().unwrap().clone();
    let summary: Vec<(String, String)> = events
        .iter()
        .map(|event| {
            (
                event["action"].as_str().unwrap().to_owned(),
                event["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for expected in [
        ("auth.signup", "success"),
        ("api_key.create", "success"),
        ("api_key.revoke", "success"),
        ("auth.failed", "denied"),
        ("api_key.create", "failure"),
    ] {
        assert!(
            summary.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "missing {expected:?} in {summary:?}"
        );
    }
    // Each row names who, from where, under which request id.
    let revoke = events
        .iter()
        .find(|event| event["action"] == "api_key.revoke")
        .unwrap();
    assert_eq!(revoke["actor_type"], "api_key");
    assert_eq!(revoke["actor_id"], json!(owner.api_key.key.id));
    assert_eq!(revoke["target"], json!(format!("api_key:{key_id}")));
    assert_eq!(revoke["source_ip"], "127.0.0.1");
    assert!(
        revoke["request_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
    let failed = events
        .iter()
        .find(|event| event["action"] == "auth.failed")
        .unwrap();
    assert_eq!(failed["target"], "GET /v1/me");
    assert_eq!(failed["status_code"], 401);

    // The unknown key's failure is recorded without a team, so no team sees it.
    assert_eq!(
        app.count(
            "SELECT count(*) FROM audit_events WHERE action = 'auth.failed' AND team_id IS NULL"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn audit_filters_and_cursor_pagination() {
    let app = spawn_app().await;
    let owner = app.signup(&email("pager"), "Pager").await;
    let key = owner.api_key.token.as_str();
    for index in 0..7 {
        app.create_key(key, json!({ "name": format!("k{index}") }))
            .await;
    }
    // Seven creations, walked two at a time, each once, newest first.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/v1/audit?action=api_key.create&limit=2&cursor={cursor}"),
            None => "/v1/audit?action=api_key.create&limit=2".to_owned(),
        };
        let page = app.get(&path, key).await;
        assert_eq!(page.status, 200, "{}", page.body);
        for event in page.body["items"].as_array().unwrap() {
            seen.push(event["id"].as_i64().unwrap());
        }
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 7);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 7);
    assert!(seen.windows(2).all(|pair| pair[0] > pair[1]));

    // By actor, by action prefix, by time.
    let by_actor = app
        .get(&format!("/v1/audit?actor={}", owner.api_key.key.id), key)
        .await;
    assert_eq!(by_actor.body["items"].as_array().unwrap().len(), 7);
    let prefix = app.get("/v1/audit?action=auth.*", key).await;
    assert_eq!(prefix.body["items"].as_array().unwrap().len(), 1);
    let future = app.get("/v1/audit?from=2999-01-01T00:00:00Z", key).await;
    assert_eq!(future.body["items"].as_array().unwrap().len(), 0);
    let past = app.get("/v1/audit?to=2000-01-01T00:00:00Z", key).await;
    assert_eq!(past.body["items"].as_array().unwrap().len(), 0);

    // Bad filters are explained; a NUL byte in a filter is one (the fuzzer found a 500:
    // PostgreSQL's text refuses it).
    app.get("/v1/audit?limit=0", key)
        .await
        .assert_error(422, "invalid_request");
    app.get("/v1/audit?actor=a%00b", key)
        .await
        .assert_error(422, "invalid_request");
    app.get("/v1/audit?cursor=abc", key)
        .await
        .assert_error(422, "invalid_request");
    app.get("/v1/audit?from=yesterday", key)
        .await
        .assert_error(422, "invalid_request");
    app.get("/v1/audit?colour=blue", key)
        .await
        .assert_error(422, "invalid_request");

    // One event by id.
    let id = seen[0];
    let one = app.get(&format!("/v1/audit/{id}"), key).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.body["action"], "api_key.create");
}

#[tokio::test]
async fn the_audit_log_cannot_be_rewritten() {
    let app = spawn_app().await;
    app.signup(&email("ledger"), "Ledger").await;
    let before = app.count("SELECT count(*) FROM audit_events").await;
    assert!(
        sqlx::query("UPDATE audit_events SET outcome = 'failure'")
            .execute(&app.db)
            .await
            .is_err()
    );
    assert!(
        sqlx::query("DELETE FROM audit_events")
            .execute(&app.db)
            .await
            .is_err()
    );
    assert!(
        sqlx::query("TRUNCATE audit_events")
            .execute(&app.db)
            .await
            .is_err()
    );
    assert_eq!(app.count("SELECT count(*) FROM audit_events").await, before);
}
