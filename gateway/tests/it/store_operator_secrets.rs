//! A provider's key kept in the operator's vault (`credential_secret`): sealed at rest (the
//! database holds no byte of it), revealed when a gateway starts and sent to the provider
//! only; a gateway whose configuration names a missing secret, or that has no vault, refuses
//! to start and names the key at fault. A ciphertext moved onto another name does not open.

use sandbase_gateway::Application;
use serde_json::Value;

use crate::helpers::spawn_with_settings;
use crate::store::{call, chat, store_app_with};
use crate::store_upstream::OPENAI_SECRET;

#[tokio::test]
async fn a_providers_key_in_the_operators_vault_reaches_only_the_provider() {
    let (first, seen) = store_app_with(|settings| {
        settings.vault.keys = vec![sandbase_vault::Keyring::generate_entry(1).into()];
    })
    .await;
    let keyring = first.settings.vault.keyring().unwrap().unwrap();
    let mut connection = first.db.acquire().await.unwrap();
    let stored = sandbase_vault::set_operator_secret(
        &mut connection,
        &keyring,
        "openai-key",
        OPENAI_SECRET.as_bytes(),
    )
    .await
    .unwrap();
    assert!(stored, "a new name");
    // At rest: no byte of the value in any column of the row.
    let row: (Vec<u8>, Vec<u8>) =
        sqlx::query_as("SELECT nonce, ciphertext FROM operator_secrets WHERE name = 'openai-key'")
            .fetch_one(&first.db)
            .await
            .unwrap();
    let secret = OPENAI_SECRET.as_bytes();
    assert!(!row.1.windows(secret.len()).any(|window| window == secret));
    // Copied onto another name, the ciphertext does not open.
    sqlx::query(
        "INSERT INTO operator_secrets (name, kek_version, nonce, ciphertext) \
         SELECT 'moved', kek_version, nonce, ciphertext FROM operator_secrets WHERE name = 'openai-key'",
    )
    .execute(&first.db)
    .await
    .unwrap();
    assert!(
        sandbase_vault::reveal_operator_secret(&mut connection, &keyring, "moved")
            .await
            .is_err()
    );

    // A gateway whose provider names the secret sends it upstream.
    let mut settings = first.settings.clone();
    settings.store.providers[0].credential_file = None;
    settings.store.providers[0].credential_secret = Some("openai-key".to_owned());
    let second = spawn_with_settings(settings.clone()).await;
    let team = second.signup("vaulted@example.com", "Vaulted").await;
    let answer = call(
        &second,
        "/openai/v1/chat/completions",
        &team.api_key.token,
        chat("openai/gpt-test", "hi", false),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from the stand-in"
    );
    assert_eq!(
        seen.last().await.0["authorization"],
        format!("Bearer {OPENAI_SECRET}")
    );

    // A missing secret, and a gateway without a vault: no start, the key named.
    let mut missing = settings.clone();
    missing.store.providers[0].credential_secret = Some("nobody".to_owned());
    let refused = format!("{:#}", Application::build(missing).await.err().unwrap());
    assert!(
        refused.contains("store.providers[0].credential_secret") && refused.contains("nobody"),
        "{refused}"
    );
    let mut vaultless = settings;
    vaultless.vault.keys.clear();
    let refused = format!("{:#}", Application::build(vaultless).await.err().unwrap());
    assert!(
        refused.contains("store.providers[0].credential_secret")
            && refused.contains("vault is not configured"),
        "{refused}"
    );
}

/// The bearer the provider saw on the last call, once `call` has been made until it shows
/// `expected` (credentials are read again every second here).
async fn provider_sees(
    app: &crate::helpers::TestApp,
    seen: &crate::store_upstream::Seen,
    token: &str,
    expected: &str,
) -> u16 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let answer = call(
            app,
            "/openai/v1/chat/completions",
            token,
            chat("openai/gpt-test", "hi", false),
        )
        .await;
        let status = answer.status().as_u16();
        let sent = seen.last().await.0["authorization"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if sent == format!("Bearer {expected}") {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the provider still sees {sent}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_rotated_credential_reaches_a_running_gateway_and_an_unreadable_one_keeps_the_last() {
    let (app, seen) = store_app_with(|settings| {
        settings.vault.keys = vec![sandbase_vault::Keyring::generate_entry(1).into()];
        settings.store.credentials_refresh_secs = 1;
    })
    .await;
    let team = app.signup("rotating@example.com", "Rotating").await;
    let token = team.api_key.token.as_str();
    // A file (a mounted Secret) rewritten: the next calls carry the new value.
    let file = app.settings.store.providers[0]
        .credential_file
        .clone()
        .unwrap();
    assert_eq!(provider_sees(&app, &seen, token, OPENAI_SECRET).await, 200);
    std::fs::write(&file, "sk-rotated-by-file\n").unwrap();
    // The stand-in knows only the old key: the gateway says the operator's key was refused.
    assert_eq!(
        provider_sees(&app, &seen, token, "sk-rotated-by-file").await,
        502
    );
    // Emptied, or gone, it keeps the last value it read.
    std::fs::write(&file, "").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(
        provider_sees(&app, &seen, token, "sk-rotated-by-file").await,
        502
    );
    std::fs::write(&file, OPENAI_SECRET).unwrap();
    assert_eq!(provider_sees(&app, &seen, token, OPENAI_SECRET).await, 200);

    // An operator secret set again (`sandbase vault secret set`) reaches a gateway started
    // before it.
    let keyring = app.settings.vault.keyring().unwrap().unwrap();
    let mut connection = app.db.acquire().await.unwrap();
    sandbase_vault::set_operator_secret(
        &mut connection,
        &keyring,
        "oa-key",
        OPENAI_SECRET.as_bytes(),
    )
    .await
    .unwrap();
    let mut settings = app.settings.clone();
    settings.store.providers[0].credential_file = None;
    settings.store.providers[0].credential_secret = Some("oa-key".to_owned());
    let second = spawn_with_settings(settings).await;
    let token = second
        .signup("vaulted-rotation@example.com", "Vaulted")
        .await
        .api_key
        .token;
    assert_eq!(
        provider_sees(&second, &seen, &token, OPENAI_SECRET).await,
        200
    );
    sandbase_vault::set_operator_secret(
        &mut connection,
        &keyring,
        "oa-key",
        b"sk-rotated-in-vault",
    )
    .await
    .unwrap();
    assert_eq!(
        provider_sees(&second, &seen, &token, "sk-rotated-in-vault").await,
        502
    );
    // Removed from the vault: the last value stays in use.
    sandbase_vault::remove_operator_secret(&second.db, "oa-key")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(
        provider_sees(&second, &seen, &token, "sk-rotated-in-vault").await,
        502
    );
}
