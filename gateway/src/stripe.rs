//! Buying credits with Stripe: Checkout Sessions (a Stripe customer per team) and the
//! webhook that grants what was paid for, exactly once, and takes back what was refunded.
//!
//! The webhook's `Stripe-Signature` is checked the way Stripe documents it: HMAC-SHA256 of
//! `"{t}.{body}"` with the endpoint secret, any of the `v1` values accepted, compared in
//! constant time, `t` within the tolerance. Each event id is recorded in the same database
//! transaction as its effect, so a redelivered or concurrently delivered event changes
//! nothing the second time; grants also carry the session id as their idempotency key, so
//! `completed` and `async_payment_succeeded` for one session grant once.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sandbase_billing::{Credits, Debit, GrantSource, NewGrant};
use secrecy::ExposeSecret;
use serde_json::Value;
use sha2::Sha256;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::config::StripeSettings;

/// Why a webhook was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureError {
    Missing,
    Malformed,
    TooOld,
    Mismatch,
}

/// Checks a `Stripe-Signature` header against `body`.
pub fn verify_signature(
    header: &str,
    body: &[u8],
    secret: &str,
    now: i64,
    tolerance_secs: u64,
) -> Result<(), SignatureError> {
    use subtle::ConstantTimeEq;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<i64>().ok(),
            Some(("v1", value)) => signatures.push(value.to_owned()),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::Missing);
    }
    if now.abs_diff(timestamp) > tolerance_secs {
        return Err(SignatureError::TooOld);
    }
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).map_err(|_| SignatureError::Malformed)?;
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let expected = hex::encode(mac.finalize().into_bytes());
    let matched = signatures
        .iter()
        .any(|signature| bool::from(signature.as_bytes().ct_eq(expected.as_bytes())));
    if matched {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// `application/x-www-form-urlencoded`, as Stripe's API takes it.
fn form(pairs: &[(&str, String)]) -> String {
    let encode = |text: &str| {
        let mut encoded = String::new();
        for byte in text.bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
                encoded.push(byte as char);
            } else {
                encoded.push_str(&format!("%{byte:02X}"));
            }
        }
        encoded
    };
    pairs
        .iter()
        .map(|(key, value)| format!("{}={}", encode(key), encode(value)))
        .collect::<Vec<_>>()
        .join("&")
}

pub struct Stripe<'a> {
    pub http: &'a reqwest::Client,
    pub settings: &'a StripeSettings,
}

impl Stripe<'_> {
    async fn post(
        &self,
        path: &str,
        idempotency_key: &str,
        pairs: &[(&str, String)],
    ) -> anyhow::Result<Value> {
        let secret = self
            .settings
            .secret_key
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("stripe.secret_key is not set"))?;
        let answer = self
            .http
            .post(format!(
                "{}{path}",
                self.settings.api_base.trim_end_matches('/')
            ))
            .bearer_auth(secret.expose_secret())
            .header("Idempotency-Key", idempotency_key)
            .header("content-type", "application/x-www-form-urlencoded")
            .timeout(Duration::from_secs(30))
            .body(form(pairs))
            .send()
            .await?;
        let status = answer.status();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        anyhow::ensure!(
            status.is_success(),
            "Stripe answered {status} to {path}: {}",
            body["error"]["message"].as_str().unwrap_or("no message")
        );
        Ok(body)
    }

    /// The team's Stripe customer, created on first use.
    pub async fn customer(
        &self,
        db: &sqlx::PgPool,
        team_id: Uuid,
        team_name: &str,
    ) -> anyhow::Result<String> {
        if let Some(customer) = sqlx::query_scalar::<_, String>(
            "SELECT customer_id FROM stripe_customers WHERE team_id = $1",
        )
        .bind(team_id)
        .fetch_optional(db)
        .await?
        {
            return Ok(customer);
        }
        let created = self
            .post(
                "/v1/customers",
                &format!("sandbase-customer-{team_id}"),
                &[
                    ("name", team_name.to_owned()),
                    ("metadata[team_id]", team_id.to_string()),
                ],
            )
            .await?;
        let customer = created["id"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("Stripe created a customer without an id"))?
            .to_owned();
        sqlx::query(
            "INSERT INTO stripe_customers (team_id, customer_id) VALUES ($1, $2) ON CONFLICT (team_id) DO NOTHING",
        )
        .bind(team_id)
        .bind(&customer)
        .execute(db)
        .await?;
        // Whoever stored first wins (the idempotency key made it the same customer anyway).
        Ok(
            sqlx::query_scalar("SELECT customer_id FROM stripe_customers WHERE team_id = $1")
                .bind(team_id)
                .fetch_one(db)
                .await?,
        )
    }

    /// A Checkout Session for `credits`; returns (session id, URL).
    pub async fn checkout(
        &self,
        customer: &str,
        team_id: Uuid,
        credits: u64,
        idempotency_key: &str,
    ) -> anyhow::Result<(String, String)> {
        let session = self
            .post(
                "/v1/checkout/sessions",
                idempotency_key,
                &[
                    ("mode", "payment".to_owned()),
                    ("customer", customer.to_owned()),
                    ("client_reference_id", team_id.to_string()),
                    ("success_url", self.settings.success_url.clone()),
                    ("cancel_url", self.settings.cancel_url.clone()),
                    ("metadata[team_id]", team_id.to_string()),
                    ("metadata[credits]", credits.to_string()),
                    ("line_items[0][quantity]", credits.to_string()),
                    (
                        "line_items[0][price_data][currency]",
                        self.settings.currency.clone(),
                    ),
                    (
                        "line_items[0][price_data][unit_amount]",
                        self.settings.unit_amount.to_string(),
                    ),
                    (
                        "line_items[0][price_data][product_data][name]",
                        "SandBase credits".to_owned(),
                    ),
                ],
            )
            .await?;
        let id = session["id"].as_str().unwrap_or_default().to_owned();
        let url = session["url"].as_str().unwrap_or_default().to_owned();
        anyhow::ensure!(
            !id.is_empty() && !url.is_empty(),
            "Stripe answered a session without id or url"
        );
        Ok((id, url))
    }
}

/// What handling an event did (recorded with the event id), and the team whose credits
/// changed.
pub async fn handle_event(
    connection: &mut PgConnection,
    event: &Value,
    settings: &StripeSettings,
) -> anyhow::Result<(&'static str, Option<Uuid>)> {
    let object = &event["data"]["object"];
    match event["type"].as_str().unwrap_or_default() {
        "checkout.session.completed" | "checkout.session.async_payment_succeeded" => {
            if object["payment_status"] != "paid" {
                return Ok(("not paid yet", None));
            }
            let session_id = object["id"].as_str().unwrap_or_default();
            let session: Option<(Uuid, i64)> = sqlx::query_as(
                "SELECT team_id, credits FROM stripe_sessions WHERE id = $1 FOR UPDATE",
            )
            .bind(session_id)
            .fetch_optional(&mut *connection)
            .await?;
            let Some((team_id, credits)) = session else {
                return Ok(("unknown session", None));
            };
            sqlx::query("UPDATE stripe_sessions SET payment_intent = coalesce($2, payment_intent), granted = true WHERE id = $1")
                .bind(session_id)
                .bind(object["payment_intent"].as_str())
                .execute(&mut *connection)
                .await?;
            let granted = sandbase_billing::grant(
                connection,
                NewGrant {
                    team_id,
                    source: GrantSource::Purchase,
                    amount: Credits::from_credits(credits)
                        .ok_or_else(|| anyhow::anyhow!("credits out of range"))?,
                    priority: 20,
                    effective_at: None,
                    expires_at: None,
                    idempotency_key: format!("stripe-session:{session_id}"),
                    description: "credits purchased".to_owned(),
                    details: serde_json::json!({ "stripe_session": session_id, "event": event["id"] }),
                },
            )
            .await?;
            let outcome = if granted.is_some() {
                "granted"
            } else {
                "already granted"
            };
            if let Some(payment_intent) = object["payment_intent"].as_str() {
                apply_held(connection, payment_intent, settings).await?;
            }
            Ok((outcome, Some(team_id)))
        }
        "charge.refunded" => reversal(connection, event, Reversal::Refund, settings).await,
        "charge.dispute.created" => reversal(connection, event, Reversal::Dispute, settings).await,
        "charge.dispute.closed" if object["status"] == "won" => {
            reversal(connection, event, Reversal::DisputeWon, settings).await
        }
        _ => Ok(("ignored", None)),
    }
}

/// Money going back to the customer, and what it does to the credits it bought.
#[derive(Debug, Clone, Copy)]
enum Reversal {
    /// `charge.refunded`: the charge's `amount_refunded` so far (cumulative).
    Refund,
    /// `charge.dispute.created`: the disputed `amount` is taken back at once.
    Dispute,
    /// `charge.dispute.closed`, won: the disputed credits are given back.
    DisputeWon,
}

/// Applies a refund or dispute to the credits its payment bought. One that arrives before its
/// checkout session has completed (its payment intent not known yet) is held, and applied
/// when the session completes.
async fn reversal(
    connection: &mut PgConnection,
    event: &Value,
    kind: Reversal,
    settings: &StripeSettings,
) -> anyhow::Result<(&'static str, Option<Uuid>)> {
    let object = &event["data"]["object"];
    let Some(payment_intent) = object["payment_intent"].as_str() else {
        return Ok(("no payment intent", None));
    };
    let session: Option<(String, Uuid, i64)> = sqlx::query_as(
        "SELECT id, team_id, refunded_cents FROM stripe_sessions \
         WHERE payment_intent = $1 AND granted FOR UPDATE",
    )
    .bind(payment_intent)
    .fetch_optional(&mut *connection)
    .await?;
    let Some((session_id, team_id, already_refunded)) = session else {
        sqlx::query(
            "INSERT INTO stripe_held_events (event_id, payment_intent, event) VALUES ($1, $2, $3) \
             ON CONFLICT (event_id) DO NOTHING",
        )
        .bind(event["id"].as_str().unwrap_or_default())
        .bind(payment_intent)
        .bind(event)
        .execute(&mut *connection)
        .await?;
        return Ok(("held until its payment completes", None));
    };
    let micro = |cents: i64| {
        (i128::from(cents) * i128::from(sandbase_billing::MICRO_PER_CREDIT)
            / i128::from(settings.unit_amount.max(1))) as i64
    };
    match kind {
        Reversal::Refund => {
            let refunded_total = object["amount_refunded"].as_i64().unwrap_or(0);
            let newly = refunded_total - already_refunded;
            if newly <= 0 {
                return Ok(("nothing new refunded", None));
            }
            sqlx::query("UPDATE stripe_sessions SET refunded_cents = $2 WHERE id = $1")
                .bind(&session_id)
                .bind(refunded_total)
                .execute(&mut *connection)
                .await?;
            let key = format!("stripe-refund:{session_id}:{refunded_total}");
            take_back(connection, team_id, micro(newly), key, "credits refunded").await?;
            Ok(("refund taken back", Some(team_id)))
        }
        Reversal::Dispute => {
            let dispute = object["id"].as_str().unwrap_or_default();
            let cents = object["amount"].as_i64().unwrap_or(0);
            let key = format!("stripe-dispute:{dispute}");
            take_back(connection, team_id, micro(cents), key, "credits disputed").await?;
            Ok(("dispute taken back", Some(team_id)))
        }
        Reversal::DisputeWon => {
            let dispute = object["id"].as_str().unwrap_or_default();
            let amount = Credits(micro(object["amount"].as_i64().unwrap_or(0)));
            if amount.0 > 0 {
                sandbase_billing::grant(
                    connection,
                    NewGrant {
                        team_id,
                        source: GrantSource::Purchase,
                        amount,
                        priority: 20,
                        effective_at: None,
                        expires_at: None,
                        idempotency_key: format!("stripe-dispute-won:{dispute}"),
                        description: "disputed credits given back".to_owned(),
                        details: serde_json::json!({ "stripe_dispute": dispute }),
                    },
                )
                .await?;
            }
            Ok(("dispute won, credits given back", Some(team_id)))
        }
    }
}

/// Debits `micro` credits once per `key`.
async fn take_back(
    connection: &mut PgConnection,
    team_id: Uuid,
    micro: i64,
    key: String,
    why: &str,
) -> anyhow::Result<()> {
    if micro > 0 {
        sandbase_billing::debit(
            connection,
            Debit {
                team_id,
                amount: Credits(micro),
                idempotency_key: key,
                description: why.to_owned(),
                details: serde_json::json!({}),
            },
        )
        .await?;
    }
    Ok(())
}

/// Applies what was held for a payment that has now completed.
async fn apply_held(
    connection: &mut PgConnection,
    payment_intent: &str,
    settings: &StripeSettings,
) -> anyhow::Result<()> {
    let held: Vec<Value> = sqlx::query_scalar(
        "DELETE FROM stripe_held_events WHERE payment_intent = $1 RETURNING event",
    )
    .bind(payment_intent)
    .fetch_all(&mut *connection)
    .await?;
    for event in held {
        let kind = match event["type"].as_str().unwrap_or_default() {
            "charge.refunded" => Reversal::Refund,
            "charge.dispute.created" => Reversal::Dispute,
            _ => Reversal::DisputeWon,
        };
        let (outcome, _) = reversal(connection, &event, kind, settings).await?;
        tracing::info!(event = %event["id"], outcome, "a held Stripe event was applied");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
        mac.update(format!("{timestamp}.").as_bytes());
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }

    #[test]
    fn signatures_are_checked_like_stripe_does() {
        let body = br#"{"id":"evt_1"}"#;
        let good = sign("whsec_test", 1000, body);
        let header = format!("t=1000,v1={good}");
        assert_eq!(
            verify_signature(&header, body, "whsec_test", 1100, 300),
            Ok(())
        );
        // Any of several v1 values (a rolled secret) is accepted.
        let header = format!("t=1000,v1=deadbeef,v1={good},v0=old");
        assert_eq!(
            verify_signature(&header, body, "whsec_test", 1000, 300),
            Ok(())
        );
        assert_eq!(
            verify_signature(&format!("t=1000,v1={good}"), body, "whsec_test", 1301, 300),
            Err(SignatureError::TooOld)
        );
        assert_eq!(
            verify_signature(&format!("t=1000,v1={good}"), b"{}", "whsec_test", 1000, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(&format!("t=1000,v1={good}"), body, "whsec_other", 1000, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature("v1=abc", body, "whsec_test", 1000, 300),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            verify_signature("t=1000", body, "whsec_test", 1000, 300),
            Err(SignatureError::Missing)
        );
    }

    #[test]
    fn forms_are_encoded() {
        assert_eq!(
            form(&[
                ("metadata[team_id]", "a b&c".to_owned()),
                ("mode", "payment".to_owned())
            ]),
            "metadata%5Bteam_id%5D=a%20b%26c&mode=payment"
        );
    }
}
