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
        seen.last().0["authorization"],
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
