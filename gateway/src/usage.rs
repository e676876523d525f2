//! Usage in, charges out. Workers report samples (a sandbox's cumulative wall and CPU time,
//! numbered per sandbox) and events (egress bytes, API calls, model tokens); the gateway
//! acknowledges a report only once it is written to PostgreSQL. A charger turns what was
//! written into ledger debits in batches: a sandbox is charged for how far its highest
//! counters moved past what was charged before (so a resent or late sample adds nothing),
//! events at the price table's price. Each charged row names the debit that charged it and
//! each debit names its usage, so every charge is traceable both ways.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use sandbase_api::internal::{UsageReceipt, UsageReport, UsageSample};
use sandbase_billing::{Credits, Debit};
use uuid::Uuid;

use crate::config::{BillingSettings, EVENT_KINDS};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Most samples and events in one report.
pub const MAX_REPORT: usize = 10_000;
/// Most rows one charging pass takes.
const CHARGE_BATCH: i64 = 20_000;

pub fn internal_router() -> Router<AppState> {
    Router::new()
        .route("/internal/v1/usage", post(report))
        .layer(axum::extract::DefaultBodyLimit::max(16 * 1024 * 1024))
}

async fn report(
    State(state): State<AppState>,
    headers: HeaderMap,
    crate::extract::ApiJson(report): crate::extract::ApiJson<UsageReport>,
) -> ApiResult<Json<UsageReceipt>> {
    if !state.workers.authenticates(&headers) {
        return Err(ApiError::problem(
            StatusCode::UNAUTHORIZED,
            "invalid_node_token",
            "missing or wrong node token",
        ));
    }
    Ok(Json(
        ingest(&state.db, &state.settings.billing, &report).await?,
    ))
}

/// Checks a report as a whole: nothing of a report with a bad entry is written.
/// Audit actions a node may raise about its sandboxes.
const NODE_AUDIT_ACTIONS: &[&str] = &["sandbox.egress_denied", "sandbox.credential_leak_blocked"];

fn validate(report: &UsageReport, billing: &BillingSettings) -> ApiResult<()> {
    if report.samples.len() + report.events.len() + report.audit.len() > MAX_REPORT {
        return Err(ApiError::InvalidRequest(format!(
            "a report holds at most {MAX_REPORT} samples and events"
        )));
    }
    let max = i64::MAX as u64;
    for (index, sample) in report.samples.iter().enumerate() {
        if sample.seq == 0 || sample.seq > max || sample.uptime_ms > max || sample.cpu_usec > max {
            return Err(ApiError::InvalidRequest(format!(
                "`samples[{index}]`: `seq` starts at 1 and counters fit in 63 bits"
            )));
        }
    }
    for (index, event) in report.audit.iter().enumerate() {
        if event.key.is_empty()
            || event.key.len() > 200
            || !NODE_AUDIT_ACTIONS.contains(&event.action.as_str())
        {
            return Err(ApiError::InvalidRequest(format!(
                "`audit[{index}]`: a key of 1 to 200 bytes and an action among {}",
                NODE_AUDIT_ACTIONS.join(", ")
            )));
        }
    }
    for (index, event) in report.events.iter().enumerate() {
        if event.key.is_empty() || event.key.len() > 200 || event.quantity > max {
            return Err(ApiError::InvalidRequest(format!(
                "`events[{index}]`: a key of 1 to 200 bytes and a quantity that fits in 63 bits"
            )));
        }
        if !EVENT_KINDS.contains(&event.kind.as_str()) {
            return Err(ApiError::InvalidRequest(format!(
                "`events[{index}].kind` must be one of {}",
                EVENT_KINDS.join(", ")
            )));
        }
        if billing.price_of(&event.kind, &event.subject, 0).is_none() {
            return Err(ApiError::problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_price",
                format!(
                    "`events[{index}]`: the price table has no price for {} of `{}`",
                    event.kind, event.subject
                ),
            ));
        }
    }
    Ok(())
}

/// Writes a batch of samples reported by `worker` (which must host their sandboxes); a
/// resend conflicts and changes nothing. Returns how many were new.
pub async fn insert_samples(
    connection: &mut sqlx::PgConnection,
    samples: &[UsageSample],
    worker: &str,
) -> Result<u64, sqlx::Error> {
    let sandbox: Vec<Uuid> = samples.iter().map(|s| s.sandbox).collect();
    let seq: Vec<i64> = samples.iter().map(|s| s.seq as i64).collect();
    let uptime: Vec<i64> = samples.iter().map(|s| s.uptime_ms as i64).collect();
    let cpu: Vec<i64> = samples.iter().map(|s| s.cpu_usec as i64).collect();
    let last: Vec<bool> = samples.iter().map(|s| s.last).collect();
    let at: Vec<DateTime<Utc>> = samples.iter().map(|s| s.sampled_at).collect();
    let done = sqlx::query(
        "INSERT INTO usage_samples (sandbox_id, team_id, seq, uptime_ms, cpu_usec, final, sampled_at) \
         SELECT r.sandbox, s.team_id, r.seq, r.uptime, r.cpu, r.last, r.at \
         FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::bool[], $6::timestamptz[]) \
              AS r (sandbox, seq, uptime, cpu, last, at) \
         JOIN sandboxes s ON s.id = r.sandbox AND s.worker_id = $7 \
         ON CONFLICT (sandbox_id, seq) DO NOTHING",
    )
    .bind(&sandbox)
    .bind(&seq)
    .bind(&uptime)
    .bind(&cpu)
    .bind(&last)
    .bind(&at)
    .bind(worker)
    .execute(connection)
    .await?;
    Ok(done.rows_affected())
}

/// Writes a report in one transaction (answering only once it is durable). Samples and
/// events of sandboxes this worker does not host are dropped; resends change nothing.
pub async fn ingest(
    db: &sqlx::PgPool,
    billing: &BillingSettings,
    report: &UsageReport,
) -> ApiResult<UsageReceipt> {
    validate(report, billing)?;
    let mut transaction = db.begin().await?;
    let mut receipt = UsageReceipt::default();
    if !report.samples.is_empty() {
        receipt.samples = insert_samples(&mut transaction, &report.samples, &report.worker).await?;
    }
    if !report.events.is_empty() {
        let events = &report.events;
        let key: Vec<&str> = events.iter().map(|e| e.key.as_str()).collect();
        let sandbox: Vec<Uuid> = events.iter().map(|e| e.sandbox).collect();
        let kind: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        let subject: Vec<&str> = events.iter().map(|e| e.subject.as_str()).collect();
        let quantity: Vec<i64> = events.iter().map(|e| e.quantity as i64).collect();
        let at: Vec<DateTime<Utc>> = events.iter().map(|e| e.occurred_at).collect();
        receipt.events = sqlx::query(
            "INSERT INTO usage_events (event_key, team_id, sandbox_id, api_key_id, kind, subject, quantity, occurred_at) \
             SELECT $7 || ':' || r.key, s.team_id, r.sandbox, s.api_key_id, r.kind, r.subject, r.quantity, r.at \
             FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::int8[], $6::timestamptz[]) \
                  AS r (key, sandbox, kind, subject, quantity, at) \
             JOIN sandboxes s ON s.id = r.sandbox AND s.worker_id = $7 \
             ON CONFLICT (event_key) DO NOTHING",
        )
        .bind(&key)
        .bind(&sandbox)
        .bind(&kind)
        .bind(&subject)
        .bind(&quantity)
        .bind(&at)
        .bind(&report.worker)
        .execute(&mut *transaction)
        .await?
        .rows_affected();
    }
    if !report.audit.is_empty() {
        let audit = &report.audit;
        let key: Vec<String> = audit
            .iter()
            .map(|e| format!("{}:{}", report.worker, e.key))
            .collect();
        let sandbox: Vec<Uuid> = audit.iter().map(|e| e.sandbox).collect();
        let action: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
        let details: Vec<sqlx::types::Json<&serde_json::Value>> = audit
            .iter()
            .map(|e| sqlx::types::Json(&e.details))
            .collect();
        let at: Vec<DateTime<Utc>> = audit.iter().map(|e| e.occurred_at).collect();
        // Only for sandboxes this worker hosts; the key (in `details`) makes resends no-ops.
        sqlx::query(
            "INSERT INTO audit_events (occurred_at, team_id, actor_type, actor_id, action, target, \
               outcome, details) \
             SELECT r.at, s.team_id, 'system', 'worker:' || $6, r.action, 'sandbox:' || r.sandbox, \
               'denied', r.details || jsonb_build_object('event_key', r.key) \
             FROM unnest($1::text[], $2::uuid[], $3::text[], $4::jsonb[], $5::timestamptz[]) \
                  AS r (key, sandbox, action, details, at) \
             JOIN sandboxes s ON s.id = r.sandbox AND s.worker_id = $6 \
             ON CONFLICT ((details->>'event_key')) WHERE details ? 'event_key' DO NOTHING",
        )
        .bind(&key)
        .bind(&sandbox)
        .bind(&action)
        .bind(&details)
        .bind(&at)
        .bind(&report.worker)
        .execute(&mut *transaction)
        .await?;
    }
    transaction.commit().await?;
    Ok(receipt)
}

/// What one charging pass booked: (team, API key, amount) per debit, for the admission
/// cache to follow once the pass has committed.
pub type Charged = Vec<(Uuid, Option<Uuid>, i64)>;

/// Micro-credits due for a sandbox's counters, from zero: charges are differences of this,
/// so rounding never accumulates.
fn runtime_due(per_second: i64, cpu_second_micro: u64, uptime_ms: i64, cpu_usec: i64) -> i64 {
    let wall = (per_second.max(0) as u128 * uptime_ms.max(0) as u128).div_ceil(1000);
    let cpu = (u128::from(cpu_second_micro) * cpu_usec.max(0) as u128).div_ceil(1_000_000);
    i64::try_from(wall + cpu).unwrap_or(i64::MAX)
}

#[derive(sqlx::FromRow)]
struct Metered {
    id: Uuid,
    team_id: Uuid,
    api_key_id: Option<Uuid>,
    cpu_millis: i32,
    memory_mb: i32,
    sampled_seq: i64,
    sampled_ms: i64,
    sampled_cpu_usec: i64,
    metered_seq: i64,
    metered_ms: i64,
    metered_cpu_usec: i64,
}

/// Charging passes of all gateways take turns (a transaction-scoped advisory lock).
const CHARGE_LOCK: i64 = 0x5342_5553_4147_4531;

/// Charges everything waiting, a batch at a time.
pub async fn charge_all(state: &AppState) -> anyhow::Result<()> {
    while charge(state).await? >= CHARGE_BATCH as usize {}
    Ok(())
}

/// Folds reported samples into their sandboxes' highest counters, then charges sandboxes
/// whose counters moved at least `billing.charge_every_secs` of wall or CPU time past what
/// was charged — or at all, once they stopped, reported their last sample, or have a spend
/// cap — and every reported event. Returns how many rows it took (a full batch means more
/// are waiting).
pub async fn charge(state: &AppState) -> anyhow::Result<usize> {
    let billing = &state.settings.billing;
    let mut transaction = state.db.begin().await?;
    let (turn,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_xact_lock($1)")
        .bind(CHARGE_LOCK)
        .fetch_one(&mut *transaction)
        .await?;
    if !turn {
        return Ok(0);
    }
    let mut charged: Charged = Vec::new();

    // Samples: one statement folds a batch into the highest counters per sandbox.
    let (taken,): (i64,) = sqlx::query_as(
        "WITH picked AS ( \
             UPDATE usage_samples u SET processed = true \
             FROM (SELECT id FROM usage_samples WHERE NOT processed ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) p \
             WHERE u.id = p.id RETURNING u.sandbox_id, u.seq, u.uptime_ms, u.cpu_usec, u.final), \
         highest AS ( \
             SELECT sandbox_id, max(seq) AS seq, max(uptime_ms) AS ms, max(cpu_usec) AS cpu, bool_or(final) AS last \
             FROM picked GROUP BY sandbox_id), \
         folded AS ( \
             UPDATE sandboxes s SET sampled_seq = greatest(s.sampled_seq, h.seq), \
                 sampled_ms = greatest(s.sampled_ms, h.ms), \
                 sampled_cpu_usec = greatest(s.sampled_cpu_usec, h.cpu), \
                 sampled_final = s.sampled_final OR h.last \
             FROM highest h WHERE s.id = h.sandbox_id RETURNING s.id) \
         SELECT (SELECT count(*) FROM picked) + 0 * (SELECT count(*) FROM folded)",
    )
    .bind(CHARGE_BATCH)
    .fetch_one(&mut *transaction)
    .await?;
    let taken = taken as usize;

    let due: Vec<Metered> = sqlx::query_as(
        "SELECT id, team_id, api_key_id, cpu_millis, memory_mb, sampled_seq, sampled_ms, sampled_cpu_usec, \
                metered_seq, metered_ms, metered_cpu_usec \
         FROM sandboxes \
         WHERE (sampled_ms <> metered_ms OR sampled_cpu_usec <> metered_cpu_usec OR sampled_final <> metered_final) \
           AND (state <> 'running' OR sampled_final OR max_credits IS NOT NULL \
                OR sampled_ms - metered_ms >= $1 OR sampled_cpu_usec - metered_cpu_usec >= $1 * 1000) \
         ORDER BY id LIMIT 5000 FOR NO KEY UPDATE",
    )
    .bind(billing.charge_every_secs as i64 * 1000)
    .fetch_all(&mut *transaction)
    .await?;
    for row in due {
        let resources = sandbase_api::sandboxes::Resources {
            cpu_millis: row.cpu_millis as u32,
            memory_mb: row.memory_mb as u32,
            disk_mb: 0,
            pids: 0,
        };
        let per_second = crate::credits::price_per_second(resources, billing);
        let (uptime_ms, cpu_usec) = (row.sampled_ms, row.sampled_cpu_usec);
        let amount = runtime_due(per_second, billing.cpu_second_micro, uptime_ms, cpu_usec)
            - runtime_due(
                per_second,
                billing.cpu_second_micro,
                row.metered_ms,
                row.metered_cpu_usec,
            );
        let mut booked_amount = 0;
        if amount > 0 {
            let booked = sandbase_billing::debit(
                &mut transaction,
                Debit {
                    team_id: row.team_id,
                    amount: Credits(amount),
                    idempotency_key: format!("runtime:{}:{uptime_ms}:{cpu_usec}", row.id),
                    description: "sandbox runtime".to_owned(),
                    details: serde_json::json!({
                        "kind": "runtime",
                        "sandbox": row.id,
                        // The samples this charge covers, by sequence number.
                        "samples": [row.metered_seq + 1, row.sampled_seq],
                        "milliseconds": uptime_ms - row.metered_ms,
                        "cpu_usec": cpu_usec - row.metered_cpu_usec,
                        "vcpu_millis": row.cpu_millis,
                        "memory_mb": row.memory_mb,
                        "price_per_second_micro": per_second,
                        "cpu_second_micro": billing.cpu_second_micro,
                    }),
                },
            )
            .await?;
            if booked.is_some() {
                booked_amount = amount;
                charged.push((row.team_id, row.api_key_id, amount));
            }
        }
        sqlx::query(
            "UPDATE sandboxes SET metered_seq = sampled_seq, metered_ms = sampled_ms, \
               metered_cpu_usec = sampled_cpu_usec, metered_final = sampled_final, \
               spent_micro = spent_micro + $2 WHERE id = $1",
        )
        .bind(row.id)
        .bind(booked_amount)
        .execute(&mut *transaction)
        .await?;
        add_key_spend(&mut transaction, row.api_key_id, booked_amount).await?;
    }

    // Events: summed per team, sandbox, key, kind and subject, then priced.
    type EventRow = (i64, Uuid, Option<Uuid>, Option<Uuid>, String, String, i64);
    let events: Vec<EventRow> =
        sqlx::query_as(
            "UPDATE usage_events u SET processed = true \
             FROM (SELECT id FROM usage_events WHERE NOT processed ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) p \
             WHERE u.id = p.id \
             RETURNING u.id, u.team_id, u.sandbox_id, u.api_key_id, u.kind, u.subject, u.quantity",
        )
        .bind(CHARGE_BATCH)
        .fetch_all(&mut *transaction)
        .await?;
    let taken = taken.max(events.len());
    type Group = (Uuid, Option<Uuid>, Option<Uuid>, String, String);
    let mut groups: BTreeMap<Group, (i64, Vec<i64>)> = BTreeMap::new();
    for (id, team, sandbox, key, kind, subject, quantity) in events {
        let group = groups
            .entry((team, sandbox, key, kind, subject))
            .or_default();
        group.0 = group.0.saturating_add(quantity);
        group.1.push(id);
    }
    for ((team_id, sandbox, api_key_id, kind, subject), (quantity, ids)) in groups {
        // Prices may change between report and charge; a kind priced out since is free.
        let Some((amount, price)) = billing.price_of(&kind, &subject, quantity) else {
            continue;
        };
        if amount <= 0 {
            continue;
        }
        let (first, last) = (ids[0], ids[ids.len() - 1]);
        let booked = sandbase_billing::debit(
            &mut transaction,
            Debit {
                team_id,
                amount: Credits(amount),
                idempotency_key: format!("usage:{kind}:{first}:{last}:{}", ids.len()),
                description: kind.replace('_', " "),
                details: serde_json::json!({
                    "kind": kind,
                    "subject": subject,
                    "sandbox": sandbox,
                    "quantity": quantity,
                    "events": ids.len(),
                    "price_micro": price.micro,
                    "price_per": price.per,
                }),
            },
        )
        .await?;
        let Some(booked) = booked else { continue };
        charged.push((team_id, api_key_id, amount));
        if let Some(sandbox) = sandbox {
            sqlx::query("UPDATE sandboxes SET spent_micro = spent_micro + $2 WHERE id = $1")
                .bind(sandbox)
                .bind(amount)
                .execute(&mut *transaction)
                .await?;
        }
        add_key_spend(&mut transaction, api_key_id, amount).await?;
        sqlx::query("UPDATE usage_events SET transaction_id = $2 WHERE id = ANY($1)")
            .bind(&ids)
            .bind(booked.transaction_id)
            .execute(&mut *transaction)
            .await?;
    }
    transaction.commit().await?;
    for (team_id, api_key_id, amount) in charged {
        state.admission.charged(team_id, api_key_id, amount).await?;
    }
    Ok(taken)
}

async fn add_key_spend(
    transaction: &mut sqlx::PgConnection,
    api_key_id: Option<Uuid>,
    amount: i64,
) -> Result<(), sqlx::Error> {
    if let (Some(key), true) = (api_key_id, amount > 0) {
        sqlx::query("UPDATE api_keys SET spent_micro = spent_micro + $2 WHERE id = $1")
            .bind(key)
            .bind(amount)
            .execute(transaction)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::runtime_due;

    #[test]
    fn charges_are_differences_so_rounding_does_not_add_up() {
        // 15 micro-credits a second, charged every 333 ms: the sum of the differences is
        // the price of the whole, not 3 × the rounded-up thirds.
        let mut total = 0;
        let mut previous = 0;
        for step in 1..=30 {
            let now = runtime_due(15, 0, step * 333, 0);
            total += now - previous;
            previous = now;
        }
        assert_eq!(total, runtime_due(15, 0, 9990, 0));
        assert_eq!(total, 150);
        // CPU time: 5 micro-credits a CPU-second, 1.5 s → 8 (rounded up once).
        assert_eq!(runtime_due(0, 5, 0, 1_500_000), 8);
    }
}
