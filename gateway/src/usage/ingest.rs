//! Usage in: workers report samples (a sandbox's cumulative wall and CPU time, numbered
//! per sandbox) and events (egress bytes, API calls, model tokens); a report is written in
//! one transaction and acknowledged only once durable. Resends change nothing.

use chrono::{DateTime, Utc};
use sandbase_api::internal::{UsageReceipt, UsageReport, UsageSample};
use uuid::Uuid;

use crate::config::{BillingSettings, EVENT_KINDS};
use crate::error::{ApiError, ApiResult};

/// Most samples and events in one report.
pub const MAX_REPORT: usize = 10_000;

/// Audit actions a node may raise about its sandboxes.
const NODE_AUDIT_ACTIONS: &[&str] = &["sandbox.egress_denied", "sandbox.credential_leak_blocked"];

/// Checks a report as a whole: nothing of a report with a bad entry is written.
fn validate(report: &UsageReport, billing: &BillingSettings) -> ApiResult<()> {
    if report.samples.len() + report.events.len() + report.audit.len() > MAX_REPORT {
        return Err(ApiError::InvalidRequest(format!(
            "a report holds at most {MAX_REPORT} samples and events"
        )));
    }
    let max = i64::MAX as u64;
    for (index, sample) in report.samples.iter().enumerate() {
        if sample.seq == 0
            || sample.seq > max
            || sample.uptime_ms > max
            || sample.cpu_usec > max
            || sample.paused_ms > sample.uptime_ms
        {
            return Err(ApiError::InvalidRequest(format!(
                "`samples[{index}]`: `seq` starts at 1, counters fit in 63 bits and \
                 `paused_ms` is at most `uptime_ms`"
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
            return Err(ApiError::UnknownPrice(format!(
                "`events[{index}]`: the price table has no price for {} of `{}`",
                event.kind, event.subject
            )));
        }
    }
    Ok(())
}

/// Writes a batch of samples reported by `worker` (which must host their sandboxes); a
/// resend conflicts and changes nothing. Returns how many were new. Rows go in key order, so
/// concurrent reports that overlap in other orders wait for each other rather than risk a
/// deadlock (each holding a key the other wants).
pub async fn insert_samples(
    connection: &mut sqlx::PgConnection,
    samples: &[UsageSample],
    worker: &str,
) -> Result<u64, sqlx::Error> {
    let sandbox: Vec<Uuid> = samples.iter().map(|s| s.sandbox).collect();
    let seq: Vec<i64> = samples.iter().map(|s| s.seq as i64).collect();
    let uptime: Vec<i64> = samples.iter().map(|s| s.uptime_ms as i64).collect();
    let cpu: Vec<i64> = samples.iter().map(|s| s.cpu_usec as i64).collect();
    let paused: Vec<i64> = samples.iter().map(|s| s.paused_ms as i64).collect();
    let last: Vec<bool> = samples.iter().map(|s| s.last).collect();
    let at: Vec<DateTime<Utc>> = samples.iter().map(|s| s.sampled_at).collect();
    let done = sqlx::query(
        "INSERT INTO usage_samples (sandbox_id, team_id, seq, uptime_ms, cpu_usec, final, sampled_at, paused_ms) \
         SELECT r.sandbox, s.team_id, r.seq, r.uptime, r.cpu, r.last, r.at, r.paused \
         FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::bool[], $6::timestamptz[], $8::int8[]) \
              AS r (sandbox, seq, uptime, cpu, last, at, paused) \
         JOIN sandboxes s ON s.id = r.sandbox AND s.worker_id = $7 \
         ORDER BY r.sandbox, r.seq \
         ON CONFLICT (sandbox_id, seq) DO NOTHING",
    )
    .bind(&sandbox)
    .bind(&seq)
    .bind(&uptime)
    .bind(&cpu)
    .bind(&last)
    .bind(&at)
    .bind(worker)
    .bind(&paused)
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
             ORDER BY r.key \
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
             ORDER BY r.key \
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
