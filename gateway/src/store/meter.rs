//! Admission and settlement of a store call. Before the call is forwarded its worst case is
//! reserved in Redis against the team's credits and the caps of the calling key and its
//! ancestors (one script, so concurrent calls cannot all pass on one balance); once it is
//! over, its real cost is debited on the ledger with its row in `store_requests` (one
//! transaction), the cached budgets follow, and only then is the reservation released — the
//! money is always in the reservation or in the ledger, never in neither.

use std::time::{Duration, Instant};

use sandbase_billing::{Credits, Debit};
use uuid::Uuid;

use super::Model;
use super::usage::TokenUsage;
use crate::auth::Principal;
use crate::config::TokenPrices;
use crate::credits::{Admitted, Cap};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// What a call is to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Model,
    Api,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Model => "model",
            Kind::Api => "api",
        }
    }
}

/// An admitted call, holding its reservation until it is settled.
pub struct Call {
    pub kind: Kind,
    pub id: Uuid,
    pub team_id: Uuid,
    pub api_key_id: Option<Uuid>,
    /// Who called, for the audit log: (`api_key` or `user`, id).
    actor: (&'static str, String),
    /// The sandbox calling from inside, if one is.
    pub sandbox: Option<Uuid>,
    /// The key and its ancestors, and the sandbox: the caps it counts against.
    caps: Vec<Cap>,
    pub reserved: i64,
    pub started: Instant,
    pub name: String,
    pub endpoint: String,
    pub streamed: bool,
}

/// How a call ended.
pub struct Outcome {
    pub status: u16,
    pub usage: Option<TokenUsage>,
    /// `usage` is the provider's final count (not an estimate from a stream cut short).
    pub complete: bool,
    /// Bill the reservation when no usage arrived (an answer was given, its count was not).
    pub estimate_if_unknown: bool,
    pub first_byte: Option<Duration>,
}

/// The most a call can cost: every input token at the dearest input price (the request's
/// size in bytes bounds its tokens, and so does the context window), the output at the
/// request's maximum (or the model's default).
/// `choices` answers asked at once (`n`) each cost their output.
pub fn worst_case(
    model: &Model,
    request_bytes: usize,
    max_output: Option<u64>,
    choices: u64,
) -> i64 {
    let window = model.settings.context_window;
    let input = (request_bytes as u64).min(window);
    let output = max_output
        .unwrap_or(model.settings.max_output)
        .min(window)
        .saturating_mul(choices.max(1));
    let prices = &model.prices;
    let dearest = prices
        .input
        .max(prices.cached_input)
        .max(prices.cache_write);
    let worst = TokenUsage {
        input_tokens: input,
        output_tokens: output,
        ..TokenUsage::default()
    };
    super::usage::cost(
        &worst,
        &TokenPrices {
            input: dearest,
            ..*prices
        },
    )
}

/// What a call is, before it is admitted.
pub struct Asked<'a> {
    pub kind: Kind,
    pub name: &'a str,
    /// What a key's allow-list must name for the call: the model's id, `api:NAME` for a paid
    /// API, `mcp:NAME` for an operator's MCP server. One rule for every store surface.
    pub listed_as: String,
    pub endpoint: String,
    pub streamed: bool,
    /// How long the call may take (the reservation outlives it).
    pub hold_for: Duration,
    /// The sandbox calling from inside (its spend cap applies too).
    pub sandbox: Option<Uuid>,
}

/// Reserves `worst` for a call of `principal`; refused calls are 403 `model_not_allowed`
/// (a model the key may not call), 402 `insufficient_credits` or `spend_cap_reached`.
pub async fn admit(
    state: &AppState,
    principal: &Principal,
    asked: Asked<'_>,
    worst: i64,
) -> ApiResult<Call> {
    let Asked {
        kind,
        name,
        listed_as,
        endpoint,
        streamed,
        hold_for,
        sandbox,
    } = asked;
    let api_key_id = principal.api_key_id();
    let keys = super::allowed::lineage_allowing(state, api_key_id, &listed_as).await?;
    let mut caps: Vec<Cap> = keys.into_iter().map(Cap::Key).collect();
    caps.extend(sandbox.map(Cap::Sandbox));
    let id = Uuid::now_v7();
    let ttl_ms = (hold_for + state.store.drain + Duration::from_secs(60)).as_millis() as u64;
    let admitted = state
        .billing
        .admission
        .reserve(&state.db, principal.team_id, &caps, id, worst, ttl_ms)
        .await?;
    match admitted {
        Admitted::Yes => Ok(Call {
            kind,
            id,
            team_id: principal.team_id,
            api_key_id,
            actor: (principal.actor_type(), principal.actor_id()),
            sandbox,
            caps,
            reserved: worst,
            started: Instant::now(),
            name: name.to_owned(),
            endpoint,
            streamed,
        }),
        Admitted::InsufficientCredits => Err(ApiError::InsufficientCredits),
        Admitted::KeyCapReached | Admitted::SandboxCapReached => Err(ApiError::SpendCapReached),
    }
}

/// How a call is settled: its status, usage and cost.
pub struct Settled {
    pub status: u16,
    pub usage: TokenUsage,
    pub cost: i64,
    pub estimated: bool,
    pub first_byte: Option<Duration>,
    /// Bytes of the answer (paid APIs priced by size).
    pub bytes: u64,
}

/// Books a model call: its metered usage priced, or its reservation when no usage came.
pub async fn settle(
    state: &AppState,
    call: Call,
    prices: &TokenPrices,
    outcome: Outcome,
) -> anyhow::Result<i64> {
    let (usage, cost, estimated) = match outcome.usage {
        Some(usage) => {
            if !outcome.complete {
                metrics::counter!("sandbase_store_estimated_total").increment(1);
                tracing::warn!(request = %call.id, model = %call.name, "the stream ended before its final usage: its input and the output its deltas carried are billed");
            }
            let cost = super::usage::cost(&usage, prices);
            (usage, cost, !outcome.complete)
        }
        None if outcome.estimate_if_unknown => {
            metrics::counter!("sandbase_store_estimated_total").increment(1);
            tracing::warn!(request = %call.id, model = %call.name, "no usage came back: the reservation is billed");
            (TokenUsage::default(), call.reserved, true)
        }
        None => (TokenUsage::default(), 0, false),
    };
    let settled = Settled {
        status: outcome.status,
        usage,
        cost,
        estimated,
        first_byte: outcome.first_byte,
        bytes: 0,
    };
    book(state, call, settled).await
}

/// Books a call's cost and row, then releases its reservation. Returns what it cost.
pub async fn book(state: &AppState, call: Call, settled: Settled) -> anyhow::Result<i64> {
    let Settled {
        status,
        usage,
        cost,
        estimated,
        first_byte,
        bytes,
    } = settled;
    let mut transaction = state.db.begin().await?;
    let debit = if cost > 0 {
        let details = details(&call, &usage, estimated, bytes);
        sandbase_billing::debit(
            &mut transaction,
            Debit {
                team_id: call.team_id,
                amount: Credits(cost),
                idempotency_key: format!("store:{}", call.id),
                description: format!("{} {}", call.kind.as_str(), call.name),
                details,
            },
        )
        .await?
        .map(|outcome| outcome.transaction_id)
    } else {
        None
    };
    let latency = call.started.elapsed().as_millis() as i64;
    sqlx::query(
        "INSERT INTO store_requests (id, team_id, api_key_id, kind, name, endpoint, streamed, status, \
           input_tokens, cached_input_tokens, cache_write_tokens, output_tokens, cost_micro, estimated, \
           latency_ms, first_byte_ms, transaction_id, sandbox_id) \
         VALUES ($1, $2, $3, $17, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $18)",
    )
    .bind(call.id)
    .bind(call.team_id)
    .bind(call.api_key_id)
    .bind(&call.name)
    .bind(&call.endpoint)
    .bind(call.streamed)
    .bind(i32::from(status))
    .bind(usage.input_tokens as i64)
    .bind(usage.cached_input_tokens as i64)
    .bind(usage.cache_write_tokens as i64)
    .bind(usage.output_tokens as i64)
    .bind(cost)
    .bind(estimated)
    .bind(latency)
    .bind(first_byte.map(|at| at.as_millis() as i64))
    .bind(debit)
    .bind(call.kind.as_str())
    .bind(call.sandbox)
    .execute(&mut *transaction)
    .await?;
    if debit.is_some() {
        crate::usage::charge::add_key_spend(&mut transaction, call.api_key_id, cost).await?;
        if let Some(sandbox) = call.sandbox {
            sqlx::query("UPDATE sandboxes SET spent_micro = spent_micro + $2 WHERE id = $1")
                .bind(sandbox)
                .bind(cost)
                .execute(&mut *transaction)
                .await?;
        }
    }
    if estimated {
        let entry = crate::audit::Entry {
            team_id: Some(call.team_id),
            actor_type: call.actor.0,
            actor_id: Some(call.actor.1.clone()),
            action: "store.call_estimated".to_owned(),
            target: Some(format!("store_request:{}", call.id)),
            outcome: "success",
            status_code: Some(status),
            details: serde_json::json!({ "model": call.name, "credits_micro": cost }),
        };
        crate::audit::insert(&mut transaction, &entry, None, None).await?;
    }
    transaction.commit().await?;
    if debit.is_some() {
        state
            .billing
            .admission
            .charged(call.team_id, &call.caps, cost)
            .await?;
    }
    release(state, &call).await;
    Ok(cost)
}

/// What the ledger's debit of a call says about it (never a prompt or a completion).
fn details(call: &Call, usage: &TokenUsage, estimated: bool, bytes: u64) -> serde_json::Value {
    match call.kind {
        Kind::Model => serde_json::json!({
            "kind": "model",
            "model": call.name,
            "key": call.api_key_id,
            "sandbox": call.sandbox,
            "request": call.id,
            "input_tokens": usage.input_tokens,
            "cached_input_tokens": usage.cached_input_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "output_tokens": usage.output_tokens,
            "estimated": estimated,
        }),
        Kind::Api => serde_json::json!({
            "kind": "api",
            "api": call.name,
            "key": call.api_key_id,
            "sandbox": call.sandbox,
            "request": call.id,
            "bytes": bytes,
        }),
    }
}

/// Gives a call's reservation back (a call that was refused upstream costs nothing).
pub async fn release(state: &AppState, call: &Call) {
    if let Err(error) = state
        .billing
        .admission
        .release(call.team_id, &call.caps, call.id, call.reserved)
        .await
    {
        tracing::warn!(
            error = format!("{error:#}"),
            "releasing a store reservation (it expires on its own)"
        );
    }
}
