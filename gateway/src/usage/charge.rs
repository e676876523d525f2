//! Charges out: a charger turns what was written into ledger debits in batches. A sandbox
//! is charged for how far its highest counters moved past what was charged before (so a
//! resent or late sample adds nothing), events at the price table's price. Each charged row
//! names the debit that charged it and each debit names its usage, so every charge is
//! traceable both ways.

use std::collections::BTreeMap;

use sandbase_billing::{Credits, Debit};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::config::BillingSettings;
use crate::sandboxes::SandboxState;
use crate::state::AppState;

/// Most rows one charging pass takes.
const CHARGE_BATCH: i64 = 20_000;

/// What one charging pass booked: (team, the API key charged and its ancestors, amount) per
/// debit, for the admission cache to follow once the pass has committed.
pub type Charged = Vec<(Uuid, Vec<crate::credits::Cap>, i64)>;

/// A sandbox's cumulative counters.
#[derive(Debug, Clone, Copy)]
struct Counters {
    uptime_ms: i64,
    paused_ms: i64,
    cpu_usec: i64,
}

/// Prices of a sandbox's time, in micro-credits.
#[derive(Debug, Clone, Copy)]
struct Rates {
    /// Per second running, and per second paused.
    running: i64,
    paused: i64,
    /// Per second of CPU time.
    cpu_second: u64,
}

/// Micro-credits due for a sandbox's counters, from zero: charges are differences of this,
/// so rounding never accumulates.
fn runtime_due(rates: Rates, counters: Counters) -> i64 {
    let paused = counters.paused_ms.clamp(0, counters.uptime_ms.max(0));
    let running = counters.uptime_ms.max(0) - paused;
    let wall = (rates.running.max(0) as u128 * running as u128
        + rates.paused.max(0) as u128 * paused as u128)
        .div_ceil(1000);
    let cpu = (u128::from(rates.cpu_second) * counters.cpu_usec.max(0) as u128).div_ceil(1_000_000);
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
    sampled_paused_ms: i64,
    metered_seq: i64,
    metered_ms: i64,
    metered_cpu_usec: i64,
    metered_paused_ms: i64,
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
    let samples = fold_samples(&mut transaction).await?;
    charge_runtime(&mut transaction, billing, &mut charged).await?;
    let events = charge_events(&mut transaction, billing, &mut charged).await?;
    transaction.commit().await?;
    for (team_id, keys, amount) in charged {
        state
            .billing
            .admission
            .charged(team_id, &keys, amount)
            .await?;
    }
    Ok(samples.max(events))
}

/// Samples: one statement folds a batch into the highest counters per sandbox. Returns how
/// many samples it took.
async fn fold_samples(transaction: &mut PgConnection) -> Result<usize, sqlx::Error> {
    let (taken,): (i64,) = sqlx::query_as(
        "WITH picked AS ( \
             UPDATE usage_samples u SET processed = true \
             FROM (SELECT id FROM usage_samples WHERE NOT processed ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) p \
             WHERE u.id = p.id RETURNING u.sandbox_id, u.seq, u.uptime_ms, u.cpu_usec, u.paused_ms, u.final), \
         highest AS ( \
             SELECT sandbox_id, max(seq) AS seq, max(uptime_ms) AS ms, max(cpu_usec) AS cpu, \
                    max(paused_ms) AS paused, bool_or(final) AS last \
             FROM picked GROUP BY sandbox_id), \
         folded AS ( \
             UPDATE sandboxes s SET sampled_seq = greatest(s.sampled_seq, h.seq), \
                 sampled_ms = greatest(s.sampled_ms, h.ms), \
                 sampled_cpu_usec = greatest(s.sampled_cpu_usec, h.cpu), \
                 sampled_paused_ms = greatest(s.sampled_paused_ms, h.paused), \
                 sampled_final = s.sampled_final OR h.last \
             FROM highest h WHERE s.id = h.sandbox_id RETURNING s.id) \
         SELECT (SELECT count(*) FROM picked) + 0 * (SELECT count(*) FROM folded)",
    )
    .bind(CHARGE_BATCH)
    .fetch_one(transaction)
    .await?;
    Ok(taken as usize)
}

/// Runtime: every sandbox whose counters moved far enough (or that stopped, or has a cap)
/// is charged for how far they moved past what was charged.
async fn charge_runtime(
    transaction: &mut PgConnection,
    billing: &BillingSettings,
    charged: &mut Charged,
) -> Result<(), sqlx::Error> {
    let due: Vec<Metered> = sqlx::query_as(
        "SELECT id, team_id, api_key_id, cpu_millis, memory_mb, sampled_seq, sampled_ms, sampled_cpu_usec, \
                sampled_paused_ms, metered_seq, metered_ms, metered_cpu_usec, metered_paused_ms \
         FROM sandboxes \
         WHERE (sampled_ms <> metered_ms OR sampled_cpu_usec <> metered_cpu_usec OR sampled_final <> metered_final) \
           AND (state NOT IN ($2, $3) OR sampled_final OR max_credits IS NOT NULL \
                OR sampled_ms - metered_ms >= $1 OR sampled_cpu_usec - metered_cpu_usec >= $1 * 1000) \
         ORDER BY id LIMIT 5000 FOR NO KEY UPDATE",
    )
    .bind(billing.charge_every_secs as i64 * 1000)
    .bind(SandboxState::Running)
    .bind(SandboxState::Paused)
    .fetch_all(&mut *transaction)
    .await?;
    for row in due {
        let headroom = headroom(&mut *transaction, Some(row.id), row.api_key_id).await?;
        let booked_amount = charge_sandbox(&mut *transaction, billing, &row, headroom).await?;
        sqlx::query(
            "UPDATE sandboxes SET metered_seq = sampled_seq, metered_ms = sampled_ms, \
               metered_cpu_usec = sampled_cpu_usec, metered_paused_ms = sampled_paused_ms, \
               metered_final = sampled_final, \
               spent_micro = spent_micro + $2 WHERE id = $1",
        )
        .bind(row.id)
        .bind(booked_amount)
        .execute(&mut *transaction)
        .await?;
        let keys = add_key_spend(&mut *transaction, row.api_key_id, booked_amount).await?;
        if booked_amount > 0 {
            let mut caps = crate::credits::Cap::keys(&keys);
            caps.push(crate::credits::Cap::Sandbox(row.id));
            charged.push((row.team_id, caps, booked_amount));
        }
    }
    Ok(())
}

/// What a sandbox's usage may still be charged before its cap or a cap of its key's lineage
/// is reached (none: no cap). A capped sandbox is stopped once a cap is reached; what it used
/// past it is not charged, so a cap is never exceeded.
async fn headroom(
    transaction: &mut PgConnection,
    sandbox: Option<Uuid>,
    api_key_id: Option<Uuid>,
) -> Result<Option<i64>, sqlx::Error> {
    if sandbox.is_none() && api_key_id.is_none() {
        return Ok(None);
    }
    sqlx::query_scalar(
        "SELECT LEAST( \
           (SELECT max_credits - spent_micro FROM sandboxes \
             WHERE id = $1 AND max_credits IS NOT NULL), \
           (SELECT min(a.max_credits - a.spent_micro) FROM api_keys k JOIN api_keys a \
              ON a.id = k.id OR a.id = ANY(k.lineage) \
             WHERE k.id = $2 AND a.max_credits IS NOT NULL))",
    )
    .bind(sandbox)
    .bind(api_key_id)
    .fetch_one(transaction)
    .await
}

/// Debits one sandbox's runtime since its last charge, at most `headroom`; returns what was
/// booked (0 when nothing was due, or the debit was booked before).
async fn charge_sandbox(
    transaction: &mut PgConnection,
    billing: &BillingSettings,
    row: &Metered,
    headroom: Option<i64>,
) -> Result<i64, sqlx::Error> {
    let resources = sandbase_api::sandboxes::Resources {
        cpu_millis: row.cpu_millis as u32,
        memory_mb: row.memory_mb as u32,
        disk_mb: 0,
        pids: 0,
    };
    let rates = Rates {
        running: crate::credits::price_per_second(resources, billing),
        paused: crate::credits::paused_price_per_second(resources, billing),
        cpu_second: billing.cpu_second_micro,
    };
    let now = Counters {
        uptime_ms: row.sampled_ms,
        paused_ms: row.sampled_paused_ms,
        cpu_usec: row.sampled_cpu_usec,
    };
    let before = Counters {
        uptime_ms: row.metered_ms,
        paused_ms: row.metered_paused_ms,
        cpu_usec: row.metered_cpu_usec,
    };
    let (uptime_ms, cpu_usec) = (now.uptime_ms, now.cpu_usec);
    let due = runtime_due(rates, now) - runtime_due(rates, before);
    let amount = headroom.map_or(due, |headroom| due.min(headroom.max(0)));
    if amount <= 0 {
        return Ok(0);
    }
    let booked = sandbase_billing::debit(
        transaction,
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
                "paused_milliseconds": now.paused_ms - before.paused_ms,
                "vcpu_millis": row.cpu_millis,
                "memory_mb": row.memory_mb,
                "price_per_second_micro": rates.running,
                "paused_price_per_second_micro": rates.paused,
                "cpu_second_micro": billing.cpu_second_micro,
                // Time past a spend cap, not charged.
                "forgiven_micro": due - amount,
            }),
        },
    )
    .await?;
    Ok(if booked.is_some() { amount } else { 0 })
}

/// Events: summed per team, sandbox, key, kind and subject, then priced. Returns how many
/// events it took.
async fn charge_events(
    transaction: &mut PgConnection,
    billing: &BillingSettings,
    charged: &mut Charged,
) -> Result<usize, sqlx::Error> {
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
    let taken = events.len();
    let mut groups: BTreeMap<EventGroup, (i64, Vec<i64>)> = BTreeMap::new();
    for (id, team, sandbox, key, kind, subject, quantity) in events {
        let group = groups
            .entry(EventGroup {
                team_id: team,
                sandbox,
                api_key_id: key,
                kind,
                subject,
            })
            .or_default();
        group.0 = group.0.saturating_add(quantity);
        group.1.push(id);
    }
    for (group, (quantity, ids)) in groups {
        if let Some((amount, keys)) =
            charge_group(&mut *transaction, billing, &group, quantity, &ids).await?
        {
            let mut caps = crate::credits::Cap::keys(&keys);
            caps.extend(group.sandbox.map(crate::credits::Cap::Sandbox));
            charged.push((group.team_id, caps, amount));
        }
    }
    Ok(taken)
}

/// Events charged together.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct EventGroup {
    team_id: Uuid,
    sandbox: Option<Uuid>,
    api_key_id: Option<Uuid>,
    kind: String,
    subject: String,
}

/// Debits one group of events; returns the amount (and the keys it counts against) when it
/// was booked now.
async fn charge_group(
    transaction: &mut PgConnection,
    billing: &BillingSettings,
    group: &EventGroup,
    quantity: i64,
    ids: &[i64],
) -> Result<Option<(i64, Vec<Uuid>)>, sqlx::Error> {
    let EventGroup {
        team_id,
        sandbox,
        api_key_id,
        kind,
        subject,
    } = group;
    // Prices may change between report and charge; a kind priced out since is free.
    let Some((due, price)) = billing.price_of(kind, subject, quantity) else {
        return Ok(None);
    };
    let headroom = headroom(&mut *transaction, *sandbox, *api_key_id).await?;
    let amount = headroom.map_or(due, |headroom| due.min(headroom.max(0)));
    if amount <= 0 {
        return Ok(None);
    }
    let (first, last) = (ids[0], ids[ids.len() - 1]);
    let booked = sandbase_billing::debit(
        &mut *transaction,
        Debit {
            team_id: *team_id,
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
                "forgiven_micro": due - amount,
                "price_per": price.per,
            }),
        },
    )
    .await?;
    let Some(booked) = booked else {
        return Ok(None);
    };
    if let Some(sandbox) = sandbox {
        sqlx::query("UPDATE sandboxes SET spent_micro = spent_micro + $2 WHERE id = $1")
            .bind(sandbox)
            .bind(amount)
            .execute(&mut *transaction)
            .await?;
    }
    let keys = add_key_spend(&mut *transaction, *api_key_id, amount).await?;
    sqlx::query("UPDATE usage_events SET transaction_id = $2 WHERE id = ANY($1)")
        .bind(ids)
        .bind(booked.transaction_id)
        .execute(&mut *transaction)
        .await?;
    Ok(Some((amount, keys)))
}

/// Adds a charge to the spending of the key and of each of its ancestors (whose caps hold for
/// their whole lineage); returns those keys.
pub(crate) async fn add_key_spend(
    transaction: &mut sqlx::PgConnection,
    api_key_id: Option<Uuid>,
    amount: i64,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let Some(key) = api_key_id else {
        return Ok(Vec::new());
    };
    if amount <= 0 {
        return crate::keys::with_ancestors(transaction, Some(key)).await;
    }
    sqlx::query_scalar(
        "UPDATE api_keys SET spent_micro = spent_micro + $2 \
         WHERE id = $1 OR id IN (SELECT unnest(lineage) FROM api_keys WHERE id = $1) RETURNING id",
    )
    .bind(key)
    .bind(amount)
    .fetch_all(transaction)
    .await
}

#[cfg(test)]
mod tests {
    use super::{Counters, Rates, runtime_due};

    fn due(running: i64, cpu_second: u64, uptime_ms: i64, paused_ms: i64, cpu_usec: i64) -> i64 {
        let rates = Rates {
            running,
            paused: 2,
            cpu_second,
        };
        runtime_due(
            rates,
            Counters {
                uptime_ms,
                paused_ms,
                cpu_usec,
            },
        )
    }

    #[test]
    fn charges_are_differences_so_rounding_does_not_add_up() {
        // 15 micro-credits a second, charged every 333 ms: the sum of the differences is
        // the price of the whole, not 3 × the rounded-up thirds.
        let mut total = 0;
        let mut previous = 0;
        for step in 1..=30 {
            let now = due(15, 0, step * 333, 0, 0);
            total += now - previous;
            previous = now;
        }
        assert_eq!(total, due(15, 0, 9990, 0, 0));
        assert_eq!(total, 150);
        // CPU time: 5 micro-credits a CPU-second, 1.5 s → 8 (rounded up once).
        assert_eq!(due(0, 5, 0, 0, 1_500_000), 8);
    }

    #[test]
    fn paused_time_is_charged_at_the_paused_rate() {
        // 10 s of which 4 s paused: 6 s × 15 + 4 s × 2.
        assert_eq!(due(15, 0, 10_000, 4_000, 0), 98);
        // A paused time past the wall time (never reported) is held to it.
        assert_eq!(due(15, 0, 1_000, 5_000, 0), 2);
    }
}
