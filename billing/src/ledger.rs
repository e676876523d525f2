//! Ledger operations. Each takes a connection inside the caller's transaction, so a grant
//! can commit together with what caused it (a sign-up, a payment).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::Credits;

/// Where granted credits come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantSource {
    Starter,
    Purchase,
    Admin,
}

impl GrantSource {
    fn as_str(self) -> &'static str {
        match self {
            GrantSource::Starter => "starter",
            GrantSource::Purchase => "purchase",
            GrantSource::Admin => "admin",
        }
    }

    /// The account the credits come from.
    fn source_account(self) -> &'static str {
        match self {
            GrantSource::Purchase => "system:purchases",
            GrantSource::Starter | GrantSource::Admin => "system:issued",
        }
    }
}

pub fn team_account(team_id: Uuid) -> String {
    format!("team:{team_id}")
}

pub struct NewGrant {
    pub team_id: Uuid,
    pub source: GrantSource,
    pub amount: Credits,
    /// Lower is used first.
    pub priority: i32,
    pub effective_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub idempotency_key: String,
    pub description: String,
    pub details: serde_json::Value,
}

/// Books a grant; `None` when its idempotency key was booked before (nothing changes).
pub async fn grant(
    connection: &mut PgConnection,
    new: NewGrant,
) -> Result<Option<Uuid>, sqlx::Error> {
    if new.amount.0 <= 0 {
        return Err(sqlx::Error::Protocol("a grant must be positive".to_owned()));
    }
    let Some(transaction) = open_transaction(
        connection,
        new.team_id,
        "grant",
        &new.idempotency_key,
        &new.description,
        &new.details,
    )
    .await?
    else {
        return Ok(None);
    };
    let grant_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO grants (id, team_id, source, amount, remaining, priority, effective_at, expires_at, transaction_id) \
         VALUES ($1, $2, $3, $4, $4, $5, coalesce($6, now()), $7, $8)",
    )
    .bind(grant_id)
    .bind(new.team_id)
    .bind(new.source.as_str())
    .bind(new.amount.0)
    .bind(new.priority)
    .bind(new.effective_at)
    .bind(new.expires_at)
    .bind(transaction)
    .execute(&mut *connection)
    .await?;
    entry(
        connection,
        transaction,
        &team_account(new.team_id),
        new.amount.0,
        Some(grant_id),
    )
    .await?;
    entry(
        connection,
        transaction,
        new.source.source_account(),
        -new.amount.0,
        None,
    )
    .await?;
    Ok(Some(grant_id))
}

pub struct Debit {
    pub team_id: Uuid,
    pub amount: Credits,
    pub idempotency_key: String,
    pub description: String,
    /// What the charge is for (the usage it prices), kept with the transaction.
    pub details: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebitOutcome {
    pub transaction_id: Uuid,
    /// (grant, amount) drawn, in burn order.
    pub drawn: Vec<(Uuid, Credits)>,
    /// What no grant covered.
    pub overdraft: Credits,
}

/// Books a charge, burning grants in order; `None` when its idempotency key was booked
/// before. The team's grants are locked for the duration, so concurrent debits serialize.
pub async fn debit(
    connection: &mut PgConnection,
    charge: Debit,
) -> Result<Option<DebitOutcome>, sqlx::Error> {
    if charge.amount.0 <= 0 {
        return Err(sqlx::Error::Protocol("a debit must be positive".to_owned()));
    }
    let Some(transaction) = open_transaction(
        connection,
        charge.team_id,
        "debit",
        &charge.idempotency_key,
        &charge.description,
        &charge.details,
    )
    .await?
    else {
        return Ok(None);
    };
    let open: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT id, remaining FROM grants \
         WHERE team_id = $1 AND remaining > 0 AND NOT expired AND effective_at <= now() \
           AND (expires_at IS NULL OR expires_at > now()) \
         ORDER BY priority, expires_at NULLS LAST, created_at, id FOR UPDATE",
    )
    .bind(charge.team_id)
    .fetch_all(&mut *connection)
    .await?;
    let account = team_account(charge.team_id);
    let mut left = charge.amount.0;
    let mut drawn = Vec::new();
    for (grant_id, remaining) in open {
        if left == 0 {
            break;
        }
        let take = remaining.min(left);
        sqlx::query("UPDATE grants SET remaining = remaining - $2 WHERE id = $1")
            .bind(grant_id)
            .bind(take)
            .execute(&mut *connection)
            .await?;
        entry(connection, transaction, &account, -take, Some(grant_id)).await?;
        drawn.push((grant_id, Credits(take)));
        left -= take;
    }
    if left > 0 {
        entry(connection, transaction, &account, -left, None).await?;
    }
    entry(
        connection,
        transaction,
        "system:usage",
        charge.amount.0,
        None,
    )
    .await?;
    Ok(Some(DebitOutcome {
        transaction_id: transaction,
        drawn,
        overdraft: Credits(left),
    }))
}

/// Moves what is left of expired grants to breakage, in a transaction of its own (a
/// savepoint inside the caller's); returns how many grants expired.
pub async fn expire_grants(connection: &mut PgConnection) -> Result<usize, sqlx::Error> {
    let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
    let expired = expire_in(&mut transaction).await?;
    transaction.commit().await?;
    Ok(expired)
}

async fn expire_in(connection: &mut PgConnection) -> Result<usize, sqlx::Error> {
    let expiring: Vec<(Uuid, Uuid, i64)> = sqlx::query_as(
        "SELECT id, team_id, remaining FROM grants \
         WHERE NOT expired AND expires_at <= now() ORDER BY expires_at LIMIT 500 \
         FOR UPDATE SKIP LOCKED",
    )
    .fetch_all(&mut *connection)
    .await?;
    for (grant_id, team_id, remaining) in &expiring {
        if *remaining > 0
            && let Some(transaction) = open_transaction(
                connection,
                *team_id,
                "expiry",
                &format!("expiry:{grant_id}"),
                "grant expired",
                &serde_json::json!({ "grant": grant_id }),
            )
            .await?
        {
            entry(
                connection,
                transaction,
                &team_account(*team_id),
                -remaining,
                Some(*grant_id),
            )
            .await?;
            entry(connection, transaction, "system:breakage", *remaining, None).await?;
        }
        sqlx::query("UPDATE grants SET remaining = 0, expired = true WHERE id = $1")
            .bind(grant_id)
            .execute(&mut *connection)
            .await?;
    }
    Ok(expiring.len())
}

#[derive(Debug, Clone, Serialize)]
pub struct Balance {
    /// What the team can spend now: its open grants, less any overdraft.
    pub available: Credits,
    pub grants: Vec<GrantView>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct GrantView {
    pub id: Uuid,
    pub source: String,
    pub amount: i64,
    pub remaining: i64,
    pub priority: i32,
    pub effective_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub expired: bool,
    pub created_at: DateTime<Utc>,
}

pub async fn balance(connection: &mut PgConnection, team_id: Uuid) -> Result<Balance, sqlx::Error> {
    let grants: Vec<GrantView> = sqlx::query_as(
        "SELECT id, source, amount, remaining, priority, effective_at, expires_at, expired, created_at \
         FROM grants WHERE team_id = $1 ORDER BY priority, expires_at NULLS LAST, created_at, id",
    )
    .bind(team_id)
    .fetch_all(&mut *connection)
    .await?;
    let open: i64 = grants
        .iter()
        .filter(|grant| {
            !grant.expired
                && grant.effective_at <= Utc::now()
                && grant.expires_at.is_none_or(|at| at > Utc::now())
        })
        .map(|grant| grant.remaining)
        .sum();
    let overdraft: Option<i64> = sqlx::query_scalar(
        "SELECT sum(amount)::bigint FROM ledger_entries WHERE account = $1 AND grant_id IS NULL",
    )
    .bind(team_account(team_id))
    .fetch_one(&mut *connection)
    .await?;
    Ok(Balance {
        available: Credits(open + overdraft.unwrap_or(0)),
        grants,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct LedgerTransactionView {
    pub id: Uuid,
    pub kind: String,
    pub description: String,
    pub details: serde_json::Value,
    pub created_at: DateTime<Utc>,
    /// The change to the team's credits (negative for charges).
    pub amount: i64,
    pub entries: Vec<LedgerEntryView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LedgerEntryView {
    pub account: String,
    pub amount: i64,
    pub grant_id: Option<Uuid>,
}

/// A team's ledger transactions, newest first, before `before` (a transaction id), with
/// their entries.
pub async fn transactions(
    connection: &mut PgConnection,
    team_id: Uuid,
    before: Option<Uuid>,
    limit: i64,
) -> Result<Vec<LedgerTransactionView>, sqlx::Error> {
    type Row = (Uuid, String, String, serde_json::Value, DateTime<Utc>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, kind, description, details, created_at FROM ledger_transactions \
         WHERE team_id = $1 AND ($2::uuid IS NULL OR (created_at, id) < \
               (SELECT created_at, id FROM ledger_transactions WHERE id = $2 AND team_id = $1)) \
         ORDER BY created_at DESC, id DESC LIMIT $3",
    )
    .bind(team_id)
    .bind(before)
    .bind(limit)
    .fetch_all(&mut *connection)
    .await?;
    let ids: Vec<Uuid> = rows.iter().map(|row| row.0).collect();
    let entries: Vec<(Uuid, String, i64, Option<Uuid>)> = sqlx::query_as(
        "SELECT transaction_id, account, amount, grant_id FROM ledger_entries \
         WHERE transaction_id = ANY($1) ORDER BY id",
    )
    .bind(&ids)
    .fetch_all(&mut *connection)
    .await?;
    let account = team_account(team_id);
    Ok(rows
        .into_iter()
        .map(|(id, kind, description, details, created_at)| {
            let mine: Vec<LedgerEntryView> = entries
                .iter()
                .filter(|entry| entry.0 == id)
                .map(|entry| LedgerEntryView {
                    account: entry.1.clone(),
                    amount: entry.2,
                    grant_id: entry.3,
                })
                .collect();
            LedgerTransactionView {
                amount: mine
                    .iter()
                    .filter(|entry| entry.account == account)
                    .map(|entry| entry.amount)
                    .sum(),
                id,
                kind,
                description,
                details,
                created_at,
                entries: mine,
            }
        })
        .collect())
}

/// A disagreement between the entries (the truth) and a projection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Mismatch {
    /// A transaction whose entries do not sum to zero.
    Unbalanced { transaction: Uuid, total: i64 },
    /// A grant whose `remaining` differs from its entries.
    GrantRemaining {
        grant: Uuid,
        projected: i64,
        from_entries: i64,
    },
    /// The whole ledger does not sum to zero.
    LedgerTotal { total: i64 },
}

/// Recomputes every projection from the entries and lists what disagrees (empty: all good).
pub async fn reconcile(connection: &mut PgConnection) -> Result<Vec<Mismatch>, sqlx::Error> {
    let mut mismatches = Vec::new();
    let unbalanced: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT transaction_id, sum(amount)::bigint FROM ledger_entries \
         GROUP BY transaction_id HAVING sum(amount) <> 0",
    )
    .fetch_all(&mut *connection)
    .await?;
    mismatches.extend(
        unbalanced
            .into_iter()
            .map(|(transaction, total)| Mismatch::Unbalanced { transaction, total }),
    );
    let grants: Vec<(Uuid, i64, i64)> = sqlx::query_as(
        "SELECT g.id, g.remaining, coalesce(sum(e.amount), 0)::bigint FROM grants g \
         LEFT JOIN ledger_entries e ON e.grant_id = g.id GROUP BY g.id, g.remaining \
         HAVING g.remaining <> coalesce(sum(e.amount), 0)",
    )
    .fetch_all(&mut *connection)
    .await?;
    mismatches.extend(grants.into_iter().map(|(grant, projected, from_entries)| {
        Mismatch::GrantRemaining {
            grant,
            projected,
            from_entries,
        }
    }));
    let total: Option<i64> = sqlx::query_scalar("SELECT sum(amount)::bigint FROM ledger_entries")
        .fetch_one(&mut *connection)
        .await?;
    if let Some(total) = total.filter(|total| *total != 0) {
        mismatches.push(Mismatch::LedgerTotal { total });
    }
    Ok(mismatches)
}

/// Starts a ledger transaction; `None` when the key was used before.
async fn open_transaction(
    connection: &mut PgConnection,
    team_id: Uuid,
    kind: &str,
    idempotency_key: &str,
    description: &str,
    details: &serde_json::Value,
) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO ledger_transactions (id, team_id, kind, idempotency_key, description, details) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
    )
    .bind(Uuid::now_v7())
    .bind(team_id)
    .bind(kind)
    .bind(idempotency_key)
    .bind(description)
    .bind(details)
    .fetch_optional(&mut *connection)
    .await
}

async fn entry(
    connection: &mut PgConnection,
    transaction: Uuid,
    account: &str,
    amount: i64,
    grant_id: Option<Uuid>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO ledger_entries (transaction_id, account, amount, grant_id) VALUES ($1, $2, $3, $4)",
    )
    .bind(transaction)
    .bind(account)
    .bind(amount)
    .bind(grant_id)
    .execute(&mut *connection)
    .await?;
    Ok(())
}
