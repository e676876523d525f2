//! The answer phase of an admitted call: the upstream request sent, refusals passed on (and
//! nothing billed), a whole answer settled before it is returned, a stream returned at once
//! — tapped for its usage, translated when the call is — and settled at its end.

use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use http::HeaderValue;
use serde_json::Value;

use super::admit::Admitted;
use super::{Answer, Streamed, Whole};
use crate::config::TokenPrices;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::meter::{self, Call, Outcome};
use crate::store::sse::Tap;
use crate::store::translate::Translator;
use crate::store::usage;

pub(super) fn upstream_error(error: reqwest::Error) -> ApiError {
    if error.is_timeout() {
        ApiError::UpstreamTimeout
    } else {
        ApiError::UpstreamFailed(if error.is_connect() {
            "connecting failed".to_owned()
        } else {
            "the connection broke off".to_owned()
        })
    }
}

pub(super) async fn answer(state: AppState, admitted: Admitted) -> Result<Answer, ApiError> {
    let Admitted {
        call,
        upstream,
        prices,
        stream,
        hide_usage,
        shape,
        translated,
    } = admitted;
    let answer = match upstream.send().await {
        Ok(answer) => answer,
        Err(error) => {
            // A timeout came after the provider had the request (and may bill it): the
            // reservation is billed. A refused connection cost nothing.
            if error.is_timeout() {
                bill_reservation(state, call, prices, 504).await;
            } else {
                meter::release(&state, &call).await;
            }
            return Err(upstream_error(error));
        }
    };
    let status = answer.status();
    let first_byte = call.started.elapsed();
    if matches!(status.as_u16(), 401 | 403) {
        tracing::error!(status = %status, model = %call.name, "the provider refused the operator's credential");
        meter::release(&state, &call).await;
        return Err(ApiError::UpstreamAuthFailed);
    }
    let content_type = answer.headers().get(http::header::CONTENT_TYPE).cloned();
    if !status.is_success() {
        let retry_after = answer.headers().get(http::header::RETRY_AFTER).cloned();
        let mut body = answer.bytes().await.unwrap_or_default();
        meter::release(&state, &call).await;
        let mut content_type = content_type;
        if let Some(translated) = &translated {
            body = translated.error(status.as_u16(), &body);
            content_type = Some(HeaderValue::from_static("application/json"));
        }
        return Ok(Answer::Whole(Whole {
            status: status.as_u16(),
            content_type,
            retry_after,
            body,
            request_id: None,
        }));
    }
    let request_id = call.id;
    if stream {
        let taps = Taps {
            tap: Tap::new(shape, hide_usage),
            translator: translated.map(|translated| translated.stream()),
        };
        return Ok(Answer::Stream(Streamed {
            status: status.as_u16(),
            content_type,
            request_id,
            body: streamed(state, call, prices, answer, taps),
        }));
    }
    let body = match answer.bytes().await {
        Ok(body) => body,
        Err(error) => {
            // The provider accepted the call and was answering: billed like a stream that
            // ended without its usage.
            bill_reservation(state, call, prices, 502).await;
            return Err(upstream_error(error));
        }
    };
    let parsed = serde_json::from_slice::<Value>(&body).ok();
    let outcome = Outcome {
        status: status.as_u16(),
        usage: parsed
            .as_ref()
            .and_then(|json| usage::from_body(shape, json)),
        complete: true,
        estimate_if_unknown: true,
        first_byte: Some(first_byte),
    };
    // Settled after the answer: the reservation holds the money until the debit is booked.
    tokio::spawn(async move {
        if let Err(error) = meter::settle(&state, call, &prices, outcome).await {
            tracing::error!(error = format!("{error:#}"), "settling a store call");
        }
    });
    let (content_type, body) = match (&translated, parsed) {
        (Some(translated), Some(answer)) => (
            Some(HeaderValue::from_static("application/json")),
            translated.answer(&answer),
        ),
        _ => (content_type, body),
    };
    Ok(Answer::Whole(Whole {
        status: status.as_u16(),
        content_type,
        retry_after: None,
        body,
        request_id: Some(request_id),
    }))
}

/// Settles a call whose answer never came whole with its reservation (marked estimated).
async fn bill_reservation(state: AppState, call: Call, prices: TokenPrices, status: u16) {
    let outcome = Outcome {
        status,
        usage: None,
        complete: false,
        estimate_if_unknown: true,
        first_byte: None,
    };
    if let Err(error) = meter::settle(&state, call, &prices, outcome).await {
        tracing::error!(
            error = format!("{error:#}"),
            "settling a store call that timed out"
        );
    }
}

/// What a stream passes through: the usage tap, then the translation when there is one.
struct Taps {
    tap: Tap,
    translator: Option<Translator>,
}

/// The stream passed through the tap as it comes; the task reading it settles the call at
/// the end, and reads on (for at most the drain time) once the client went away.
fn streamed(
    state: AppState,
    call: Call,
    prices: TokenPrices,
    answer: reqwest::Response,
    taps: Taps,
) -> futures_util::stream::BoxStream<'static, Result<Bytes, std::io::Error>> {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(32);
    tokio::spawn(async move {
        let Taps {
            mut tap,
            mut translator,
        } = taps;
        let mut upstream = answer.bytes_stream();
        let mut gone: Option<Instant> = None;
        let mut status = 200;
        let mut first_byte = None;
        loop {
            let next = match gone {
                Some(since) => {
                    let left = state.store.drain.saturating_sub(since.elapsed());
                    tokio::time::timeout(left, upstream.next())
                        .await
                        .unwrap_or(None)
                }
                None => upstream.next().await,
            };
            match next {
                Some(Ok(chunk)) => {
                    first_byte.get_or_insert_with(|| call.started.elapsed());
                    let mut out = tap.feed(&chunk);
                    if let Some(translator) = translator.as_mut() {
                        out = translator.feed(&out);
                    }
                    if gone.is_none() && !out.is_empty() && sender.send(Ok(out)).await.is_err() {
                        gone = Some(Instant::now());
                    }
                }
                Some(Err(error)) => {
                    status = 502;
                    let _ = sender.send(Err(std::io::Error::other(error))).await;
                    break;
                }
                None => break,
            }
        }
        let mut rest = tap.finish();
        if let Some(translator) = translator.as_mut() {
            let mut translated = translator.feed(&rest).to_vec();
            translated.extend_from_slice(&translator.finish());
            rest = Bytes::from(translated);
        }
        if gone.is_none() && !rest.is_empty() {
            let _ = sender.send(Ok(rest)).await;
        }
        drop(sender);
        let report = tap.report();
        let outcome = Outcome {
            status,
            usage: report.usage,
            complete: report.complete,
            estimate_if_unknown: true,
            first_byte,
        };
        if let Err(error) = meter::settle(&state, call, &prices, outcome).await {
            tracing::error!(
                error = format!("{error:#}"),
                "settling a streamed store call"
            );
        }
    });
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    })
    .boxed()
}
