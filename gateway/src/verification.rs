//! E-mail verification of new accounts (`auth.verify_email`). A sign-up makes the user and
//! the team but nothing worth having: no starter credits, no API key, no login. A code
//! (32 random bytes; only its SHA-256 is stored) goes to the address, and presenting it
//! grants the starter credits, makes the first key and opens a session. Signing up with an
//! address that is already registered answers exactly the same, and mails the owner a
//! notice instead of a code, so sign-up tells nobody which addresses have accounts.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use rand::RngCore;
use sandbase_api::{Role, Session, SignupResponse};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::accounts;
use crate::audit::Audit;
use crate::error::{ApiError, ApiResult};
use crate::mail::Mail;
use crate::state::AppState;

/// What a sign-up needs once its fields are checked and its password hashed.
pub struct NewAccount<'a> {
    pub email: &'a str,
    pub team_name: &'a str,
    pub password_hash: &'a str,
}

fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Makes an unverified account and mails its code — or, when the address is taken, mails
/// its owner a notice. Either way the caller answers the same.
pub async fn sign_up(state: &AppState, audit: &Audit, account: NewAccount<'_>) -> ApiResult<()> {
    let mut transaction = state.db.begin().await?;
    let taken = accounts::find_user_by_email(&mut transaction, account.email)
        .await?
        .is_some();
    let created = if taken {
        None
    } else {
        match accounts::create_user_with_team(
            &mut transaction,
            account.email,
            account.password_hash,
            account.team_name,
            false,
        )
        .await
        {
            Ok(created) => Some(created),
            // Registered a moment ago by a concurrent sign-up.
            Err(ApiError::EmailTaken) => None,
            Err(error) => return Err(error),
        }
    };
    let mail = match created {
        Some((user, team)) => {
            let mut bytes = [0u8; 32];
            rand::rng().fill_bytes(&mut bytes);
            let token = URL_SAFE_NO_PAD.encode(bytes);
            let ttl = chrono::Duration::seconds(
                i64::try_from(state.settings.auth.verify_ttl_secs).unwrap_or(i64::MAX / 2),
            );
            sqlx::query(
                "INSERT INTO email_verifications (token_hash, user_id, team_id, expires_at) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(token_hash(&token))
            .bind(user.id)
            .bind(team.id)
            .bind(Utc::now() + ttl)
            .execute(&mut *transaction)
            .await?;
            audit
                .record_as(
                    &mut transaction,
                    Some(team.id),
                    "user",
                    Some(user.id.to_string()),
                    Some(format!("user:{}", user.id)),
                    serde_json::json!({ "verification": "sent" }),
                )
                .await?;
            transaction.commit().await?;
            code_mail(state, account.email, &token)
        }
        None => {
            transaction.rollback().await?;
            notice_mail(account.email)
        }
    };
    // Sent in the background: how long the relay takes must not tell the two cases apart.
    if let Some(mailer) = &state.auth.mailer {
        let mailer = std::sync::Arc::clone(mailer);
        tokio::spawn(async move { mailer.send(mail).await });
    }
    Ok(())
}

fn code_mail(state: &AppState, email: &str, token: &str) -> Mail {
    let link = state.settings.auth.verify_url.replace("{token}", token);
    Mail {
        to: email.to_owned(),
        subject: "Confirm your SandBase account".to_owned(),
        body: format!(
            "Welcome to SandBase.\n\nConfirm this address to get your starter credits and your \
             first API key:\n\n  {link}\n\nor send the code yourself:\n\n  POST /v1/auth/verify \
             {{\"token\": \"{token}\"}}\n\nIf you did not sign up, ignore this mail: the account \
             stays empty and unusable.\n"
        ),
    }
}

fn notice_mail(email: &str) -> Mail {
    Mail {
        to: email.to_owned(),
        subject: "Someone tried to sign up with your address".to_owned(),
        body: "Someone tried to create a SandBase account with this e-mail address, which \
               already has one. Nothing was changed. If it was you, log in instead.\n"
            .to_owned(),
    }
}

/// What a verification code unlocks, once.
#[derive(sqlx::FromRow)]
struct Pending {
    user_id: Uuid,
    team_id: Uuid,
    expires_at: DateTime<Utc>,
    used_at: Option<DateTime<Utc>>,
}

/// Proves an address with its code: the account gets its starter credits, its first API key
/// and a session, as an unverified sign-up would have. A code works once, until it expires.
pub async fn verify(state: &AppState, audit: &Audit, token: &str) -> ApiResult<SignupResponse> {
    let mut transaction = state.db.begin().await?;
    let pending: Option<Pending> = sqlx::query_as(
        "SELECT user_id, team_id, expires_at, used_at FROM email_verifications \
         WHERE token_hash = $1 FOR UPDATE",
    )
    .bind(token_hash(token))
    .fetch_optional(&mut *transaction)
    .await?;
    let pending = pending
        .filter(|pending| pending.used_at.is_none() && pending.expires_at > Utc::now())
        .ok_or(ApiError::InvalidVerification)?;
    sqlx::query("UPDATE email_verifications SET used_at = now() WHERE token_hash = $1")
        .bind(token_hash(token))
        .execute(&mut *transaction)
        .await?;
    sqlx::query("UPDATE users SET email_verified_at = now() WHERE id = $1")
        .bind(pending.user_id)
        .execute(&mut *transaction)
        .await?;
    let user = accounts::find_user(&mut transaction, pending.user_id)
        .await?
        .ok_or(ApiError::InvalidVerification)?;
    let team = accounts::find_team(&mut transaction, pending.team_id)
        .await?
        .ok_or(ApiError::InvalidVerification)?;
    open_account(state, audit, transaction, user, team).await
}

/// What every account starts with, written in the account's own transaction: the starter
/// credits, the first (owner) API key and the audit row; then a session. At sign-up, or at
/// verification when addresses are verified.
pub async fn open_account(
    state: &AppState,
    audit: &Audit,
    mut transaction: sqlx::Transaction<'_, sqlx::Postgres>,
    user: accounts::UserRow,
    team: accounts::TeamRow,
) -> ApiResult<SignupResponse> {
    crate::credits::grant_starter(&mut transaction, team.id, &state.settings.billing).await?;
    let api_key = accounts::create_api_key(
        &mut transaction,
        team.id,
        "default",
        Role::Owner,
        Some(user.id),
        None,
    )
    .await?;
    audit
        .record_as(
            &mut transaction,
            Some(team.id),
            "user",
            Some(user.id.to_string()),
            Some(format!("user:{}", user.id)),
            serde_json::json!({ "api_key": api_key.key.public_id }),
        )
        .await?;
    transaction.commit().await?;
    let (token, expires_at) = state.auth.sessions.issue(user.id, team.id)?;
    tracing::info!(user_id = %user.id, team_id = %team.id, "account opened");
    Ok(SignupResponse {
        user: user.to_api(),
        team: team.into(),
        api_key,
        session: Session { token, expires_at },
    })
}

/// Whether `user_id` has proved its address (always, when verification is off).
pub async fn is_verified(state: &AppState, user_id: Uuid) -> ApiResult<bool> {
    if !state.settings.auth.verify_email {
        return Ok(true);
    }
    let verified: Option<Option<DateTime<Utc>>> =
        sqlx::query_scalar("SELECT email_verified_at FROM users WHERE id = $1")
            .bind(user_id)
            .fetch_optional(&state.db)
            .await?;
    Ok(matches!(verified, Some(Some(_))))
}
