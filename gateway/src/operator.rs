//! What the CLI's operator commands (`sandbase admin`, `dev`, `vault`, `worker`) do without a
//! gateway in between: the dev account and its key written to the database directly, team
//! limits, secret names, and a worker's credential derived from the node token.

use anyhow::Context;
use sandbase_api::Role;
use secrecy::SecretString;

use crate::auth::api_key::{ApiKeyToken, KeyRecord};
use crate::startup::Application;

pub use crate::admin::{set_team_rate_limit, set_team_sandbox_quota};
pub use crate::secrets::validate_name as validate_secret_name;
pub use crate::workers::credential::derive as worker_credential;

/// The single-node server's account: its user's e-mail and password, and the key saved by an
/// earlier start, if any.
pub struct DevAccount<'a> {
    pub email: &'a str,
    pub password: &'a str,
    pub saved_key: Option<&'a str>,
}

/// Makes sure the dev user, its team (with starter credits) and a working API key exist, and
/// returns the key: the saved one while it works (not revoked, no expiry), else a new one.
pub async fn ensure_dev_account(
    application: &Application,
    account: DevAccount<'_>,
) -> anyhow::Result<String> {
    let state = application.state();
    let db = &state.db;
    if let Some(key) = account.saved_key
        && let Some(token) = ApiKeyToken::parse(key)
        && let Some(record) = KeyRecord::load(db, &token.public_id).await?
        && token.matches(&record.secret_hash)
        && !record.revoked
        && record.expires_at.is_none()
    {
        return Ok(key.to_owned());
    }
    let mut transaction = db.begin().await?;
    let (team_id, user_id) =
        match crate::accounts::find_user_by_email(&mut transaction, account.email).await? {
            Some(user) => {
                let memberships = crate::accounts::memberships(&mut transaction, user.id).await?;
                let (team, _) = memberships
                    .first()
                    .context("the dev user belongs to no team; remove it or the state file")?;
                (team.id, user.id)
            }
            None => {
                let hash = state
                    .auth
                    .passwords
                    .hash(SecretString::from(account.password.to_owned()))
                    .await
                    .map_err(|error| anyhow::anyhow!("hashing the dev password: {error}"))?;
                let (user, team) = crate::accounts::create_user_with_team(
                    &mut transaction,
                    account.email,
                    &hash,
                    "dev",
                    true,
                )
                .await
                .map_err(|error| anyhow::anyhow!("creating the dev account: {error}"))?;
                crate::credits::grant_starter(&mut transaction, team.id, &state.settings.billing)
                    .await?;
                (team.id, user.id)
            }
        };
    let created = crate::accounts::create_api_key(
        &mut transaction,
        team_id,
        "dev",
        Role::Owner,
        Some(user_id),
        None,
    )
    .await
    .map_err(|error| anyhow::anyhow!("creating the dev API key: {error}"))?;
    transaction.commit().await?;
    Ok(created.token)
}
