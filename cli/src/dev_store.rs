//! The store of `sandbase dev`: the providers whose keys are in its environment
//! (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, with `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL`
//! honoured as the official SDKs honour them), each with a starter list of models. The keys
//! go into the operator's vault (operator secrets `openai` and `anthropic`), which is where
//! the gateway reads them; teams call with their SandBase key.

use sandbase_gateway::config::{ModelSettings, ProviderKind, ProviderSettings, StoreSettings};

/// (id, upstream, context window, max output, input, cached input, cache write, output):
/// prices in credits per million tokens.
type Starter = (
    &'static str,
    &'static str,
    u64,
    u64,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

const OPENAI: &[Starter] = &[
    (
        "openai/gpt-4o-mini",
        "gpt-4o-mini",
        128_000,
        16_384,
        "0.15",
        "0.075",
        "0",
        "0.60",
    ),
    (
        "openai/gpt-4.1",
        "gpt-4.1",
        1_047_576,
        32_768,
        "2.00",
        "0.50",
        "0",
        "8.00",
    ),
    (
        "openai/gpt-4.1-mini",
        "gpt-4.1-mini",
        1_047_576,
        32_768,
        "0.40",
        "0.10",
        "0",
        "1.60",
    ),
];

const ANTHROPIC: &[Starter] = &[
    (
        "anthropic/claude-sonnet-4-5",
        "claude-sonnet-4-5",
        200_000,
        64_000,
        "3",
        "0.30",
        "3.75",
        "15",
    ),
    (
        "anthropic/claude-haiku-4-5",
        "claude-haiku-4-5",
        200_000,
        64_000,
        "1",
        "0.10",
        "1.25",
        "5",
    ),
    (
        "anthropic/claude-opus-4-1",
        "claude-opus-4-1",
        200_000,
        32_000,
        "15",
        "1.50",
        "18.75",
        "75",
    ),
];

/// The provider keys found in the environment, as operator secrets: (name, value).
pub type ProviderKeys = Vec<(String, secrecy::SecretString)>;

/// The store configured from `variable` (an environment lookup), and the keys it found,
/// which the providers name as operator secrets.
pub fn from_env(variable: impl Fn(&str) -> Option<String>) -> (StoreSettings, ProviderKeys) {
    let mut store = StoreSettings::default();
    let mut keys = ProviderKeys::new();
    let families = [
        (
            "openai",
            ProviderKind::Openai,
            "OPENAI",
            "https://api.openai.com/v1",
            OPENAI,
        ),
        (
            "anthropic",
            ProviderKind::Anthropic,
            "ANTHROPIC",
            "https://api.anthropic.com",
            ANTHROPIC,
        ),
    ];
    for (name, kind, prefix, default_url, starters) in families {
        let key_variable = format!("{prefix}_API_KEY");
        let Some(key) = variable(&key_variable).filter(|key| !key.trim().is_empty()) else {
            continue;
        };
        keys.push((name.to_owned(), key.trim().to_owned().into()));
        let base_url = variable(&format!("{prefix}_BASE_URL"))
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| default_url.to_owned());
        store.providers.push(ProviderSettings {
            name: name.to_owned(),
            kind,
            base_url: base_url.trim_end_matches('/').to_owned(),
            credential_env: None,
            credential_file: None,
            credential_secret: Some(name.to_owned()),
            timeout_secs: 600,
            connect_timeout_secs: 10,
        });
        for &(id, upstream, window, max_output, input, cached, write, output) in starters {
            store.models.push(ModelSettings {
                id: id.to_owned(),
                provider: name.to_owned(),
                upstream: upstream.to_owned(),
                context_window: window,
                max_output,
                input: input.to_owned(),
                cached_input: cached.to_owned(),
                cache_write: write.to_owned(),
                output: output.to_owned(),
            });
        }
    }
    (store, keys)
}

/// Stores `keys` in the operator's vault of the database `settings` name (migrated first),
/// replacing what an earlier start stored.
pub async fn seal(
    settings: &sandbase_gateway::Settings,
    keys: &ProviderKeys,
) -> anyhow::Result<()> {
    use anyhow::Context;
    use secrecy::ExposeSecret;
    if keys.is_empty() {
        return Ok(());
    }
    let keyring = settings
        .vault
        .keyring()?
        .context("the dev server's vault key is missing")?;
    let db = sandbase_gateway::connect_database(settings).await?;
    sandbase_gateway::migrate(&db).await?;
    let mut connection = db.acquire().await?;
    for (name, value) in keys {
        sandbase_vault::set_operator_secret(
            &mut connection,
            &keyring,
            name,
            value.expose_secret().as_bytes(),
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::from_env;

    #[test]
    fn providers_come_from_the_keys_in_the_environment() {
        assert!(from_env(|_| None).0.providers.is_empty());
        let (store, keys) = from_env(|name| match name {
            "ANTHROPIC_API_KEY" => Some("sk-ant".to_owned()),
            "ANTHROPIC_BASE_URL" => Some("http://127.0.0.1:9/".to_owned()),
            _ => None,
        });
        assert_eq!(store.providers.len(), 1);
        assert_eq!(store.providers[0].base_url, "http://127.0.0.1:9");
        // The key goes to the vault, named by the provider; not read from the environment.
        assert_eq!(
            store.providers[0].credential_secret.as_deref(),
            Some("anthropic")
        );
        assert_eq!(store.providers[0].credential_env, None);
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].0, "anthropic");
        assert_eq!(secrecy::ExposeSecret::expose_secret(&keys[0].1), "sk-ant");
        assert!(
            store
                .models
                .iter()
                .all(|model| model.provider == "anthropic")
        );
        store.validate().expect("the starter list is a valid store");
        let (both, _) = from_env(|name| name.ends_with("_API_KEY").then(|| "k".to_owned()));
        assert_eq!(both.providers[0].base_url, "https://api.openai.com/v1");
        assert_eq!(both.models.len(), 6);
        both.validate().expect("valid");
    }
}
