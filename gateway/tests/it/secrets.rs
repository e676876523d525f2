//! The vault through the API: values go in encrypted and never come out; ciphertexts are
//! bound to their team, secret and version; key-encryption keys rotate without losing a value.

use reqwest::StatusCode;
use secrecy::SecretString;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{TestApp, email, spawn_app, spawn_app_with};

const VALUE: &str = "ghp_s3cr3tV4lu3ThatMustNeverLeak0123456789";

async fn vault_app(entries: &[String]) -> TestApp {
    let keys: Vec<SecretString> = entries.iter().map(|e| e.clone().into()).collect();
    spawn_app_with(move |settings| settings.vault.keys = keys).await
}

fn github(value: &str) -> Value {
    json!({
        "name": "github",
        "value": value,
        "hosts": ["api.github.com", "*.githubusercontent.com"],
        "inject": { "header": "Authorization", "format": "Bearer {value}" },
    })
}

/// Every row of every table, as text, that contains `needle` (plain or as bytea hex).
async fn rows_containing(app: &TestApp, needle: &str) -> Vec<String> {
    let tables: Vec<(String,)> = sqlx::query_as(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    let hex = hex::encode(needle.as_bytes());
    let mut found = Vec::new();
    for (table,) in tables {
        let hits: Vec<(String,)> = sqlx::query_as(&format!(
            "SELECT t::text FROM \"{table}\" t WHERE t::text LIKE '%' || $1 || '%' OR t::text LIKE '%' || $2 || '%'"
        ))
        .bind(needle)
        .bind(&hex)
        .fetch_all(&app.db)
        .await
        .unwrap();
        found.extend(hits.into_iter().map(|(row,)| format!("{table}: {row}")));
    }
    found
}

#[tokio::test]
async fn without_a_key_the_secrets_api_answers_501() {
    let app = spawn_app().await;
    let alice = app.signup(&email("alice"), "Alice").await;
    app.post("/v1/secrets", &alice.api_key.token, github(VALUE))
        .await
        .assert_error(501, "vault_not_configured");
    assert!(rows_containing(&app, VALUE).await.is_empty());
}

#[tokio::test]
async fn secrets_are_stored_encrypted_and_only_their_metadata_comes_back() {
    let app = vault_app(&[sandbase_vault::Keyring::generate_entry(1)]).await;
    let alice = app.signup(&email("alice"), "Alice").await;
    let token = alice.api_key.token.as_str();

    let created = app.post("/v1/secrets", token, github(VALUE)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["version"], 1);
    assert_eq!(
        created.body["hosts"],
        json!(["api.github.com", "*.githubusercontent.com"])
    );
    app.post("/v1/secrets", token, github("other"))
        .await
        .assert_error(409, "secret_exists");
    let updated = app
        .request(
            reqwest::Method::PUT,
            "/v1/secrets/github",
            Some(token),
            Some(json!({ "value": format!("{VALUE}-v2") })),
        )
        .await;
    assert_eq!(updated.status, StatusCode::OK, "{}", updated.body);
    assert_eq!(updated.body["version"], 2);
    let placeholder = json!({
        "name": "openai", "value": "sk-proj-abcdefghijklmnop", "hosts": ["api.openai.com"],
        "inject": { "placeholder": "OPENAI_API_KEY" },
    });
    assert_eq!(
        app.post("/v1/secrets", token, placeholder).await.status,
        StatusCode::CREATED
    );
    let listed = app.get("/v1/secrets", token).await;
    let names: Vec<&str> = listed.body["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["github", "openai"]);

    // Nothing answers with a value, and no row holds one in the clear.
    for answer in [&created.body, &updated.body, &listed.body] {
        assert!(!answer.to_string().contains("s3cr3t"), "{answer}");
    }
    for needle in [VALUE, "s3cr3tV4lu3", "sk-proj-abcdefghijklmnop"] {
        assert_eq!(rows_containing(&app, needle).await, Vec::<String>::new());
    }
    assert_eq!(
        app.count("SELECT count(*) FROM secret_versions").await,
        2,
        "each secret keeps only its current value, encrypted"
    );

    // Bad input: clear errors, nothing stored.
    let bad = bad_requests();
    for body in bad {
        app.post("/v1/secrets", token, body.clone())
            .await
            .assert_error(422, "invalid_request");
    }
    assert_eq!(app.count("SELECT count(*) FROM secrets").await, 2);

    // Members read the list but cannot change it; another team sees none of it.
    let (_, member) = app
        .create_key(token, json!({ "name": "m", "role": "member" }))
        .await;
    assert_eq!(app.get("/v1/secrets", &member).await.status, StatusCode::OK);
    app.post("/v1/secrets", &member, github("x"))
        .await
        .assert_error(403, "forbidden");
    let bob = app.signup(&email("bob"), "Bob").await;
    let theirs = app.get("/v1/secrets", &bob.api_key.token).await;
    assert_eq!(theirs.body["secrets"], json!([]));
    app.delete("/v1/secrets/github", &bob.api_key.token)
        .await
        .assert_error(404, "not_found");
    assert_eq!(
        app.delete("/v1/secrets/github", token).await.status,
        StatusCode::NO_CONTENT
    );
    app.delete("/v1/secrets/github", token)
        .await
        .assert_error(404, "not_found");
    assert_eq!(app.count("SELECT count(*) FROM secret_versions").await, 1);
    // The audit log names secrets, never values.
    assert!(
        app.count("SELECT count(*) FROM audit_events WHERE target = 'secret:github'")
            .await
            >= 3
    );
}

async fn secret_id(app: &TestApp, team: Uuid, name: &str) -> (Uuid, i32) {
    sqlx::query_as("SELECT id, version FROM secrets WHERE team_id = $1 AND name = $2")
        .bind(team)
        .bind(name)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_ciphertext_moved_to_another_team_fails_to_decrypt_and_keys_rotate() {
    let first = sandbase_vault::Keyring::generate_entry(1);
    let app = vault_app(std::slice::from_ref(&first)).await;
    let keyring = sandbase_vault::Keyring::parse([first.as_str()]).unwrap();
    let alice = app.signup(&email("alice"), "Alice").await;
    let bob = app.signup(&email("bob"), "Bob").await;
    for (token, value) in [
        (&alice.api_key.token, "alice-value-1234"),
        (&bob.api_key.token, "bob-value-5678"),
    ] {
        assert_eq!(
            app.post("/v1/secrets", token, github(value)).await.status,
            StatusCode::CREATED
        );
    }
    let (alice_secret, _) = secret_id(&app, alice.team.id, "github").await;
    let (bob_secret, _) = secret_id(&app, bob.team.id, "github").await;
    let mut connection = app.db.acquire().await.unwrap();
    let plain = sandbase_vault::reveal(&mut connection, &keyring, bob.team.id, bob_secret, 1)
        .await
        .unwrap();
    assert_eq!(plain.as_slice(), b"bob-value-5678");

    // Alice's ciphertext copied over Bob's: Bob's key and binding refuse it.
    sqlx::query(
        "UPDATE secret_versions b SET nonce = a.nonce, ciphertext = a.ciphertext \
         FROM secret_versions a WHERE a.secret_id = $1 AND b.secret_id = $2",
    )
    .bind(alice_secret)
    .bind(bob_secret)
    .execute(&mut *connection)
    .await
    .unwrap();
    let moved = sandbase_vault::reveal(&mut connection, &keyring, bob.team.id, bob_secret, 1).await;
    assert!(
        matches!(moved, Err(sandbase_vault::VaultError::Decrypt)),
        "{:?}",
        moved.map(|v| v.to_vec())
    );
    // Nor does it open as Alice's under Bob's row (the binding names the secret).
    let as_other_row =
        sandbase_vault::reveal(&mut connection, &keyring, alice.team.id, bob_secret, 1).await;
    assert!(as_other_row.is_err());
    let alice_plain =
        sandbase_vault::reveal(&mut connection, &keyring, alice.team.id, alice_secret, 1)
            .await
            .unwrap();
    assert_eq!(alice_plain.as_slice(), b"alice-value-1234");

    // Rotation: a second key-encryption key re-wraps every data key; then the first is
    // not needed any more.
    let second = sandbase_vault::Keyring::generate_entry(2);
    let both = sandbase_vault::Keyring::parse([first.as_str(), second.as_str()]).unwrap();
    assert_eq!(sandbase_vault::rotate(&app.db, &both).await.unwrap(), 2);
    assert_eq!(sandbase_vault::rotate(&app.db, &both).await.unwrap(), 0);
    assert_eq!(
        app.count("SELECT count(*) FROM vault_data_keys WHERE kek_version = 2")
            .await,
        2
    );
    let only_second = sandbase_vault::Keyring::parse([second.as_str()]).unwrap();
    let after = sandbase_vault::reveal(
        &mut connection,
        &only_second,
        alice.team.id,
        alice_secret,
        1,
    )
    .await
    .unwrap();
    assert_eq!(after.as_slice(), b"alice-value-1234");
    let with_old =
        sandbase_vault::reveal(&mut connection, &keyring, alice.team.id, alice_secret, 1).await;
    assert!(matches!(
        with_old,
        Err(sandbase_vault::VaultError::UnknownKeyVersion(2))
    ));
}

#[tokio::test]
async fn a_rotated_value_leaves_no_old_ciphertext_and_data_keys_are_replaced() {
    let entry = sandbase_vault::Keyring::generate_entry(1);
    let app = vault_app(std::slice::from_ref(&entry)).await;
    let keyring = sandbase_vault::Keyring::parse([entry.as_str()]).unwrap();
    let owner = app.signup(&email("rotating"), "Rotating").await;
    let token = owner.api_key.token.as_str();
    assert_eq!(
        app.post("/v1/secrets", token, github("old-value-1234"))
            .await
            .status,
        StatusCode::CREATED
    );
    // The credential leaked: it is set again. Only the new value remains, in any form.
    let put = app
        .request(
            reqwest::Method::PUT,
            "/v1/secrets/github",
            Some(token),
            Some(json!({ "value": "new-value-5678" })),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let (secret, version) = secret_id(&app, owner.team.id, "github").await;
    assert_eq!(version, 2);
    let versions = app
        .count(&format!(
            "SELECT count(*) FROM secret_versions WHERE secret_id = '{secret}'"
        ))
        .await;
    assert_eq!(versions, 1, "the old value's ciphertext is still stored");
    let mut connection = app.db.acquire().await.unwrap();
    let old = sandbase_vault::reveal(&mut connection, &keyring, owner.team.id, secret, 1).await;
    assert!(matches!(old, Err(sandbase_vault::VaultError::NotFound)));

    // The team's data key is replaced and the value re-encrypted under the new one.
    let before: (Vec<u8>, Vec<u8>, Vec<u8>) = sqlx::query_as(
        "SELECT k.wrapped, k.nonce, v.ciphertext FROM vault_data_keys k \
         JOIN secret_versions v ON v.team_id = k.team_id WHERE k.team_id = $1",
    )
    .bind(owner.team.id)
    .fetch_one(&mut *connection)
    .await
    .unwrap();
    let rotated = sandbase_vault::rotate_data_key(&app.db, &keyring, owner.team.id)
        .await
        .unwrap();
    assert_eq!(rotated, 1);
    let after: (Vec<u8>, Vec<u8>, Vec<u8>) = sqlx::query_as(
        "SELECT k.wrapped, k.nonce, v.ciphertext FROM vault_data_keys k \
         JOIN secret_versions v ON v.team_id = k.team_id WHERE k.team_id = $1",
    )
    .bind(owner.team.id)
    .fetch_one(&mut *connection)
    .await
    .unwrap();
    assert_ne!(before.0, after.0);
    assert_ne!(before.2, after.2);
    let value = sandbase_vault::reveal(&mut connection, &keyring, owner.team.id, secret, 2)
        .await
        .unwrap();
    assert_eq!(value.as_slice(), b"new-value-5678");
    // Whoever kept the old (wrapped) data key, from a backup, opens nothing current.
    sqlx::query("UPDATE vault_data_keys SET wrapped = $2, nonce = $3 WHERE team_id = $1")
        .bind(owner.team.id)
        .bind(&before.0)
        .bind(&before.1)
        .execute(&mut *connection)
        .await
        .unwrap();
    let with_old_key =
        sandbase_vault::reveal(&mut connection, &keyring, owner.team.id, secret, 2).await;
    assert!(matches!(
        with_old_key,
        Err(sandbase_vault::VaultError::Decrypt)
    ));
}

/// Secret requests each wrong in one way.
fn bad_requests() -> Vec<serde_json::Value> {
    vec![
        json!({ "name": "x", "value": "v", "hosts": ["10.0.0.1"], "inject": { "query": "key" } }),
        json!({ "name": "x", "value": "v", "hosts": ["localhost"], "inject": { "query": "key" } }),
        json!({ "name": "x", "value": "v", "hosts": [], "inject": { "query": "key" } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "query": "key", "header": "X-Key" } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": {} }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "header": "Host" } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "header": "X-Key", "format": "no placeholder" } }),
        json!({ "name": "x", "value": "line\r\nX-Injected: 1", "hosts": ["a.example.com"], "inject": { "header": "X-Key" } }),
        json!({ "name": "x", "value": "", "hosts": ["a.example.com"], "inject": { "header": "X-Key" } }),
        json!({ "name": "../x", "value": "v", "hosts": ["a.example.com"], "inject": { "header": "X-Key" } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "placeholder": "1BAD" } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "placeholder": { "env": "K", "in_body": true } } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "placeholder": { "env": "K", "in_url": true, "paths": ["v1/*"] } } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "placeholder": { "env": "K", "in_body": true, "paths": ["/*/chat"] } } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "placeholder": { "env": "K", "paths": ["/v1"] } } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "placeholder": { "env": "K", "in_body": "yes", "paths": ["/v1"] } } }),
        json!({ "name": "x", "value": "v", "hosts": ["a.example.com"], "inject": { "header": "X-Key" }, "usable_by": "everyone" }),
    ]
}
