//! The steps of the loop: a model call (the worst case reserved by the store before it,
//! retried on an overload before any output, 3 tries in all) and the tool calls its answer
//! asked for (each journaled `intended` first, its shell command named `{run}-{step}` so
//! that a second start answers the first), and the limits checked between them.

use std::time::Instant;

use futures_util::future::join_all;
use sandbase_api::conversation::{Message, Part, Role, ToolCall, ToolResult};
use sandbase_harness::tools::{self, ToolKind, ToolOutcome};
use sandbase_harness::{ModelRequest, model};
use sandbase_mcp::{ApiRequest, Backend};
use serde_json::{Value, json};

use crate::http::store::forward::REQUEST_HEADER;

use super::approvals::{Gate, gate};
use super::deltas::{self, Called};
use super::journal;
use super::lifecycle::Status;
use super::rows::AgentRunRow;
use super::run::{DEFAULT_MAX_TOOL_CALLS, DEFAULT_MAX_WALL_SECS, Flow, Halt, Run, backoff};

/// Tries of a model call that failed before any output.
const TRIES: u32 = 3;

/// Ends the run `limited` by `limit`.
pub async fn limited<B: Backend>(run: &Run<'_, B>, limit: &str) -> Result<Flow, Halt> {
    let message = format!("the run reached its `{limit}`");
    super::limits::reached(run, limit, "limit_reached", message).await
}

/// The run's credits (its key's cap, an ancestor's or the team's) do not cover what comes
/// next: `limited`, with the refusal's code and words.
pub async fn spent<B: Backend>(
    run: &Run<'_, B>,
    code: &str,
    message: String,
) -> Result<Flow, Halt> {
    super::limits::reached(run, "max_credits", code, message).await
}

/// The run's wall-clock limit, checked between steps.
pub async fn over_limit<B: Backend>(
    run: &Run<'_, B>,
    now: &AgentRunRow,
) -> Result<Option<Flow>, Halt> {
    let wall = now.limits.0.max_wall_secs.unwrap_or(DEFAULT_MAX_WALL_SECS);
    let started = now.started_at.unwrap_or(now.created_at);
    if (chrono::Utc::now() - started).num_seconds() > i64::try_from(wall).unwrap_or(i64::MAX) {
        return limited(run, "max_wall_secs").await.map(Some);
    }
    Ok(None)
}

/// One model call, journaled before it is made.
pub async fn model<B: Backend>(
    run: &Run<'_, B>,
    conversation: &[sandbase_api::conversation::Message],
) -> Result<Flow, Halt> {
    run.check_lease()?;
    let (conversation, elided) = sandbase_harness::context::fit(
        &run.system,
        conversation,
        run.context_window,
        run.max_output,
    );
    let mut write = journal::quick(&run.state.db, &run.lease).await?;
    if elided.len()
        > run
            .elided
            .swap(elided.len(), std::sync::atomic::Ordering::Relaxed)
    {
        write
            .event(
                "context.elided",
                json!({ "call_ids": elided, "count": elided.len() }),
            )
            .await?;
    }
    let args = json!({ "messages": conversation.len() });
    let step = write
        .intend("model", &run.row.model, None, &args, run.lease.claim.epoch)
        .await?;
    write
        .event(
            "model.started",
            json!({ "step": step, "model": run.row.model }),
        )
        .await?;
    run.commit_quick(write).await?;
    let body = ModelRequest {
        model: &run.row.model,
        family: run.family,
        system: &run.system,
        conversation: &conversation,
        tools: &run.tools,
        max_output: run.max_output,
        parallel_tool_calls: run.row.parallel_tool_calls,
    }
    .streamed();
    let started = Instant::now();
    let (called, attempt) = call_model(run, step, &body).await?;
    let latency_ms = started.elapsed().as_millis() as u64;
    let (parsed, request_id, rest) = match called {
        Called::Answer {
            answer,
            request_id,
            rest,
        } => (answer, request_id, rest),
        Called::Broken { why, .. } => {
            return failed_model(run, step, 502, "upstream_failed", &why, attempt).await;
        }
        Called::Whole(answer) => match whole(run, &answer) {
            Ok(parsed) => (
                parsed,
                answer.header(REQUEST_HEADER).map(str::to_owned),
                Vec::new(),
            ),
            Err((code, message)) => {
                return failed_model(run, step, answer.status, &code, &message, attempt).await;
            }
        },
    };
    // The store charges this call after answering it: priced here as it prices it.
    let cost = run.prices.cost(&parsed.usage);
    let result = json!({ "usage": parsed.usage, "stop_reason": parsed.stop_reason,
                         "latency_ms": latency_ms, "store_request": request_id, "attempts": attempt });
    let mut write = journal::quick(&run.state.db, &run.lease).await?;
    for (kind, data) in rest {
        write.event(kind, data).await?;
    }
    write.finish_step(step, "completed", &result, cost).await?;
    write.message(&parsed.message).await?;
    write.spent(parsed.usage, cost);
    write
        .event(
            "model.completed",
            json!({ "step": step, "model": run.row.model,
            "usage": parsed.usage, "cost_micro": cost, "stop_reason": parsed.stop_reason,
            "latency_ms": latency_ms, "message": parsed.message }),
        )
        .await?;
    run.commit_quick(write).await?;
    Ok(Flow::Continue)
}

/// A model's answer that came whole (a refusal, an error, or a provider that does not
/// stream), read; its error's code and message when it is not an answer.
fn whole<B: Backend>(
    run: &Run<'_, B>,
    answer: &sandbase_mcp::ApiAnswer,
) -> Result<sandbase_harness::ModelAnswer, (String, String)> {
    let body = answer.json().unwrap_or(Value::Null);
    let parsed = answer
        .is_success()
        .then(|| model::parse_answer(run.family, &body))
        .flatten();
    parsed.ok_or_else(|| {
        let code = body["error"]["code"]
            .as_str()
            .or(body["error"]["type"].as_str());
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("the model's answer could not be read");
        (code.unwrap_or("model_error").to_owned(), message.to_owned())
    })
}

/// The model call, tried again after an overload or a failure before any output (its
/// `Retry-After` honoured, a `model.retry` event each time), [`TRIES`] times at most; what
/// the last try came to and how many tries it took.
async fn call_model<B: Backend>(
    run: &Run<'_, B>,
    step: i32,
    body: &Value,
) -> Result<(Called, u32), Halt> {
    let mut attempt = 1;
    loop {
        run.check_lease()?;
        let request = ApiRequest::post(run.family.path(), body.clone());
        let called = match run.backend.stream(Some(&run.parts), request).await {
            Ok(stream) => deltas::read(run, step, stream).await?,
            Err(why) => Called::Broken { why, told: false },
        };
        let (status, retry_after) = match &called {
            Called::Whole(answer) => (
                answer.status,
                answer.header("retry-after").map(str::to_owned),
            ),
            Called::Broken { told: false, .. } => (502, None),
            Called::Answer { .. } | Called::Broken { told: true, .. } => (200, None),
        };
        let overloaded = matches!(status, 408 | 429 | 500..=599);
        if !overloaded || attempt == TRIES {
            return Ok((called, attempt));
        }
        let mut write = journal::quick(&run.state.db, &run.lease).await?;
        let retry = json!({ "step": step, "attempt": attempt, "status": status,
                            "retry_after": retry_after });
        write.event("model.retry", retry).await?;
        run.commit_quick(write).await?;
        tokio::time::sleep(backoff(attempt, retry_after.as_deref())).await;
        attempt += 1;
    }
}

/// A model call that failed for good: the step `failed`, the run `limited` when credits or
/// the key's cap refused it, else `failed` (`retries_exhausted` after the tries).
async fn failed_model<B: Backend>(
    run: &Run<'_, B>,
    step: i32,
    status: u16,
    code: &str,
    message: &str,
    attempts: u32,
) -> Result<Flow, Halt> {
    let mut write = journal::quick(&run.state.db, &run.lease).await?;
    let result =
        json!({ "status": status, "code": code, "message": message, "attempts": attempts });
    write.finish_step(step, "failed", &result, 0).await?;
    write.event("error", result.clone()).await?;
    run.commit_quick(write).await?;
    let message = message.to_owned();
    match (status, code) {
        (401, _) => {
            let why = "the run's key was revoked (its creator's key was, or an admin did)";
            run.settle(
                Status::Failed,
                Some(("key_revoked", why.to_owned())),
                json!([]),
            )
            .await
        }
        (402, _) => spent(run, code, message).await,
        (408 | 429 | 500..=599, _) if attempts == TRIES => {
            run.settle(
                Status::Failed,
                Some(("retries_exhausted", message)),
                json!([]),
            )
            .await
        }
        _ => {
            run.settle(Status::Failed, Some((code, message)), json!([]))
                .await
        }
    }
}

/// The tool calls of the model's last message that have no result yet: those SandBase
/// runs, in the model's order (calls that change nothing side by side when the run allows
/// it), then the run waits for the client's functions.
pub async fn tools<B: Backend>(
    run: &Run<'_, B>,
    now: &AgentRunRow,
    calls: Vec<ToolCall>,
) -> Result<Flow, Halt> {
    let max_calls = now
        .limits
        .0
        .max_tool_calls
        .unwrap_or(DEFAULT_MAX_TOOL_CALLS);
    let (functions, ours): (Vec<ToolCall>, Vec<ToolCall>) = calls
        .into_iter()
        .partition(|call| run.kind(call) == ToolKind::Function);
    let gates: Vec<Gate> = ours
        .iter()
        .map(|call| gate(run, &now.decisions, call))
        .collect();
    // What runs now: the calls before the first that waits for a person.
    let asked = gates.iter().position(|gate| matches!(gate, Gate::Ask(_)));
    let runnable = asked.unwrap_or(ours.len());
    let mut made = i64::from(now.tool_calls);
    let mut index = 0;
    while index < runnable {
        // A batch: one call that changes the sandbox, or calls that change nothing.
        let read_only = |call: &ToolCall| run.kind(call).is_read_only();
        let mut end = index + 1;
        if run.row.parallel_tool_calls && read_only(&ours[index]) {
            while end < runnable && read_only(&ours[end]) {
                end += 1;
            }
        }
        if made + (end - index) as i64 > i64::from(max_calls) {
            return limited(run, "max_tool_calls").await;
        }
        let batch = &ours[index..end];
        let results = join_all(
            batch
                .iter()
                .zip(&gates[index..end])
                .map(|(call, gate)| tool(run, call, gate)),
        )
        .await;
        for result in results {
            result?;
        }
        made += batch.len() as i64;
        index = end;
    }
    if let Some(at) = asked {
        return ask(run, &ours[at], &gates[at]).await;
    }
    if functions.is_empty() {
        return Ok(Flow::Continue);
    }
    let required: Vec<Value> = functions
        .iter()
        .map(|call| {
            json!({ "type": "tool_result", "call_id": call.id, "name": call.name,
                            "arguments": call.arguments })
        })
        .collect();
    let mut write = journal::quick(&run.state.db, &run.lease).await?;
    for call in &functions {
        write
            .event(
                "tool.called",
                json!({ "call_id": call.id, "tool": call.name,
                                           "args": call.arguments, "client": true }),
            )
            .await?;
    }
    run.commit_quick(write).await?;
    run.settle(Status::RequiresAction, None, Value::Array(required))
        .await
}

/// The run waits for a person's decision on `call`.
async fn ask<B: Backend>(run: &Run<'_, B>, call: &ToolCall, gate: &Gate) -> Result<Flow, Halt> {
    let Gate::Ask(rule) = gate else {
        return Ok(Flow::Continue);
    };
    let mut write = journal::quick(&run.state.db, &run.lease).await?;
    write
        .event(
            "approval.requested",
            json!({ "call_id": call.id, "tool": call.name,
                                               "args": call.arguments, "rule": rule }),
        )
        .await?;
    run.commit_quick(write).await?;
    let tool = sandbase_harness::approval::tool_label(run.kind(call), call);
    let required = json!([{ "type": "approval", "call_id": call.id, "name": call.name,
                            "arguments": call.arguments, "tool": tool, "rule": rule }]);
    run.settle(Status::RequiresAction, None, required).await
}

/// One tool call: journaled, run (unless denied), its result written.
async fn tool<B: Backend>(run: &Run<'_, B>, call: &ToolCall, gate: &Gate) -> Result<(), Halt> {
    run.check_lease()?;
    let kind = run.kind(call);
    let mut write = journal::quick(&run.state.db, &run.lease).await?;
    let epoch = run.lease.claim.epoch;
    let step = write
        .intend("tool", &call.name, Some(&call.id), &call.arguments, epoch)
        .await?;
    write
        .event(
            "tool.called",
            json!({ "step": step, "call_id": call.id, "tool": call.name,
                                       "args": call.arguments }),
        )
        .await?;
    run.commit_quick(write).await?;
    run.check_lease()?;
    let exec_id = exec_id(run, step);
    let started = Instant::now();
    let (sink, pieces) = tokio::sync::mpsc::unbounded_channel();
    let exec = exec_id.as_str();
    let watched = super::cancel::watched(run, &call.id, &exec_id, kind, async move {
        match kind {
            _ if matches!(gate, Gate::Deny(_)) => {
                let Gate::Deny(why) = gate else {
                    unreachable!()
                };
                ToolOutcome::error(why.clone())
            }
            ToolKind::Mcp { .. } => super::mcp::call(run, call).await,
            _ => {
                let caller = run.caller();
                let sandbox = run.sandbox();
                tools::execute(
                    run.backend,
                    &caller,
                    &sandbox,
                    exec,
                    kind,
                    call,
                    Some(&sink),
                )
                .await
            }
        }
    });
    let (outcome, written) =
        tokio::join!(watched, deltas::tool_output(run, step, &call.id, pieces));
    written?;
    record_tool(
        run,
        step,
        call,
        &outcome,
        started.elapsed().as_millis() as u64,
    )
    .await
}

/// The exec id of a tool step's command: `{run}-{step}`, the same on any gateway.
pub fn exec_id<B>(run: &Run<'_, B>, step: i32) -> String {
    format!("{}-{step}", run.row.id)
}

/// A tool step's end: the ledger, the conversation and the stream, in one write.
pub async fn record_tool<B: Backend>(
    run: &Run<'_, B>,
    step: i32,
    call: &ToolCall,
    outcome: &ToolOutcome,
    duration_ms: u64,
) -> Result<(), Halt> {
    let mut detail = outcome.detail.clone();
    detail["duration_ms"] = json!(duration_ms);
    let mut write = journal::quick(&run.state.db, &run.lease).await?;
    write
        .finish_step(step, outcome.step_state(), &detail, 0)
        .await?;
    let result = ToolResult {
        call_id: call.id.clone(),
        content: outcome.content.clone(),
        is_error: outcome.is_error,
    };
    write
        .message(&Message {
            role: Role::User,
            content: vec![Part::ToolResult(result)],
        })
        .await?;
    write
        .event(
            "tool.completed",
            json!({ "step": step, "call_id": call.id, "tool": call.name,
            "is_error": outcome.is_error, "exit_code": detail["exit_code"],
            "duration_ms": duration_ms, "exec_id": detail["exec_id"], "output": outcome.content }),
        )
        .await?;
    run.commit_quick(write).await
}
