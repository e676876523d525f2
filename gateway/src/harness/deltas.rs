//! Pieces journaled as they come, gathered by `sandbase_harness::coalesce` (a part's rows
//! at least 100 ms apart, each at most 4 KiB), so followers of the journal see them grow and
//! a replay is the same rows: a model call's streamed answer (`model.delta`, then the whole
//! answer put back together from the same events) and a `shell` command's output
//! (`tool.output.delta`).

use std::time::Instant;

use futures_util::StreamExt;
use sandbase_harness::ModelAnswer;
use sandbase_harness::coalesce::Coalescer;
use sandbase_harness::delta::Delta;
use sandbase_harness::stream::{Assembler, SseReader};
use sandbase_mcp::{ApiAnswer, ApiStream, Backend};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::journal;
use super::run::{Halt, Run};

/// What a streamed model call came to.
pub enum Called {
    /// The whole answer, read from its stream; the store's request id.
    Answer {
        answer: ModelAnswer,
        request_id: Option<String>,
        /// Its last pieces, written with the answer (one write less per call).
        rest: Vec<(&'static str, Value)>,
    },
    /// An answer that was not a stream of events (a refusal, an error), as it came.
    Whole(ApiAnswer),
    /// The call or its stream broke off; whether any of it reached the journal (a call is
    /// tried again only when none did).
    Broken { why: String, told: bool },
}

/// Reads `stream`, the answer to the model call of `step`.
pub async fn read<B: Backend>(
    run: &Run<'_, B>,
    step: i32,
    stream: ApiStream,
) -> Result<Called, Halt> {
    let events = stream.content_type.as_deref() == Some("text/event-stream");
    if !stream.is_success() || !events {
        return Ok(match stream.collect().await {
            Ok(answer) => Called::Whole(answer),
            Err(why) => Called::Broken { why, told: false },
        });
    }
    let request_id = stream
        .headers
        .get(crate::http::store::forward::REQUEST_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let mut body = stream.body;
    let mut reader = SseReader::default();
    let mut assembler = Assembler::new(run.family);
    let mut coalescer = Coalescer::default();
    let mut told = false;
    let broke = loop {
        let due = coalescer.due();
        let chunk = tokio::select! {
            chunk = body.next() => chunk,
            () = sleep_until(due), if due.is_some() => {
                told |= write(run, model_rows(step, coalescer.flush(Instant::now()))).await?;
                continue;
            }
        };
        let bytes = match chunk {
            None => break None,
            Some(Err(why)) => break Some(why),
            Some(Ok(bytes)) => bytes,
        };
        let mut rows = Vec::new();
        let mut failed = None;
        for event in reader.push(&bytes) {
            match assembler.event(&event) {
                Ok(deltas) => {
                    for delta in deltas {
                        rows.extend(coalescer.push(delta, Instant::now()));
                    }
                }
                Err(why) => failed = Some(why),
            }
        }
        told |= write(run, model_rows(step, rows)).await?;
        if failed.is_some() {
            break failed;
        }
    };
    let rest = model_rows(step, coalescer.flush(Instant::now()));
    let answer = match broke {
        Some(why) => Err(why),
        None => assembler
            .finish()
            .ok_or_else(|| "the model's stream ended before its answer did".to_owned()),
    };
    match answer {
        Ok(answer) => Ok(Called::Answer {
            answer,
            request_id,
            rest,
        }),
        Err(why) => {
            told |= write(run, rest).await?;
            Ok(Called::Broken { why, told })
        }
    }
}

async fn sleep_until(due: Option<Instant>) {
    if let Some(due) = due {
        tokio::time::sleep_until(due.into()).await;
    }
}

/// The pieces of the model call of `step`, as `model.delta` events.
fn model_rows(step: i32, rows: Vec<Delta>) -> Vec<(&'static str, Value)> {
    let row = |row: Delta| {
        let mut data = json!({ "step": step, "part": row.part, "type": row.kind.as_str(),
                               "delta": row.text });
        if let Some((call_id, tool)) = row.call {
            data["call_id"] = json!(call_id);
            data["tool"] = json!(tool);
        }
        ("model.delta", data)
    };
    rows.into_iter().map(row).collect()
}

/// Journals a tool call's output as it comes (`tool.output.delta`, `stream` `stdout` or
/// `stderr`), until its sender is gone.
pub async fn tool_output<B: Backend>(
    run: &Run<'_, B>,
    step: i32,
    call_id: &str,
    mut pieces: UnboundedReceiver<Delta>,
) -> Result<(), Halt> {
    let mut coalescer = Coalescer::default();
    let rows = |rows: Vec<Delta>| -> Vec<(&'static str, Value)> {
        let row = |row: Delta| {
            let stream = if row.part == 0 { "stdout" } else { "stderr" };
            let data = json!({ "step": step, "call_id": call_id, "stream": stream,
                               "delta": row.text });
            ("tool.output.delta", data)
        };
        rows.into_iter().map(row).collect()
    };
    loop {
        let due = coalescer.due();
        let piece = tokio::select! {
            piece = pieces.recv() => piece,
            () = sleep_until(due), if due.is_some() => {
                write(run, rows(coalescer.flush(Instant::now()))).await?;
                continue;
            }
        };
        let Some(piece) = piece else {
            write(run, rows(coalescer.flush(Instant::now()))).await?;
            return Ok(());
        };
        write(run, rows(coalescer.push(piece, Instant::now()))).await?;
    }
}

/// Journals `rows` (type and data of each event) in one write; whether there were any.
async fn write<B: Backend>(
    run: &Run<'_, B>,
    rows: Vec<(&'static str, Value)>,
) -> Result<bool, Halt> {
    if rows.is_empty() {
        return Ok(false);
    }
    run.check_lease()?;
    // Pieces need not wait for the disk (see `Quick::lazily`).
    let mut write = journal::quick(&run.state.db, &run.lease).await?.lazily();
    for (kind, data) in rows {
        write.event(kind, data).await?;
    }
    run.commit_quick(write).await?;
    Ok(true)
}
