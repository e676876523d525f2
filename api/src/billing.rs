//! Credits: balances, grants and the ledger. Amounts are integers in micro-credits
//! (`*_micro`, 1 credit = 1 000 000) with the same value as a decimal string.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BalanceAnswer {
    /// Credits the team can spend now, e.g. "9.25".
    pub available: String,
    pub available_micro: i64,
    /// Held by live reservations (the first minute of sandboxes being created or just
    /// created); charges replace them as usage comes in.
    #[serde(default)]
    pub reserved: String,
    #[serde(default)]
    pub reserved_micro: i64,
    pub grants: Vec<GrantAnswer>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GrantAnswer {
    pub id: Uuid,
    /// `starter`, `purchase` or `admin`.
    pub source: String,
    pub amount_micro: i64,
    pub remaining_micro: i64,
    /// Lower is used first.
    pub priority: i32,
    pub effective_at: DateTime<Utc>,
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    pub expired: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LedgerPage {
    pub transactions: Vec<LedgerTransaction>,
    /// Pass as `before` for the next (older) page.
    #[serde(default)]
    pub next_cursor: Option<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LedgerTransaction {
    pub id: Uuid,
    /// `grant`, `debit`, `expiry` or `refund`.
    pub kind: String,
    pub description: String,
    /// The change to the team's credits (negative for charges).
    pub amount: String,
    pub amount_micro: i64,
    pub created_at: DateTime<Utc>,
    pub entries: Vec<LedgerEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LedgerEntry {
    pub account: String,
    pub amount_micro: i64,
    #[serde(default)]
    pub grant_id: Option<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckoutRequest {
    /// Whole credits to buy.
    pub credits: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckoutAnswer {
    /// Stripe Checkout's page: open it to pay.
    pub url: String,
    pub session_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageAnswer {
    /// `hour`, `day`, `sandbox`, `kind` or `key`.
    pub group_by: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Credits spent per group, in order (time groups oldest first).
    pub series: Vec<UsagePoint>,
    pub total: String,
    pub total_micro: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsagePoint {
    /// The hour or day (RFC 3339), sandbox id, kind, or API key id (`none` for sessions).
    pub key: String,
    /// With `split_by`: the second grouping's value (sandbox id, kind, key id or model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    pub amount: String,
    pub amount_micro: i64,
}

/// An operator's grant to a team (`POST /v1/admin/teams/{id}/grants`, node token).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminGrantRequest {
    /// Credits to grant (a decimal, e.g. "25" or "0.5").
    pub credits: String,
    /// Days until the grant expires; never when absent.
    #[serde(default)]
    pub expires_in_days: Option<u32>,
    /// Lower is used first (default 10).
    #[serde(default)]
    pub priority: Option<i32>,
    #[serde(default)]
    pub note: Option<String>,
    /// The same key is granted once; a retry with it changes nothing.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminGrantAnswer {
    /// The new grant; absent when the idempotency key was granted before.
    #[serde(default)]
    pub grant_id: Option<Uuid>,
    pub credits: String,
    pub amount_micro: i64,
    /// Whether this call booked it (false: a retry of an earlier grant).
    pub granted: bool,
}
