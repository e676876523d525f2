//! Terminal sessions as the gateway sees them: a worker's output stream decoded into
//! events (the agent's frames: output bytes, a lag, the exit), and single-use attach tickets
//! for browsers (whose WebSockets cannot carry an `Authorization` header), kept in Redis so
//! any gateway redeems them.

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use rand::RngCore;
use uuid::Uuid;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// How long an attach ticket is valid.
pub const TICKET_SECS: u64 = 30;
/// Largest frame accepted from a worker (the agent's own limit).
const MAX_FRAME: usize = 4 * 1024 * 1024;

/// What a terminal's output stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalEvent {
    Output(Bytes),
    /// The reader fell behind what the sandbox keeps: output resumes at this offset.
    Lag(u64),
    /// The session's command exited with this code.
    Exit(i32),
}

/// Splits a worker's output stream (frames: kind byte, big-endian `u32` length, payload)
/// into events; ends at the `End` frame or when the stream does.
pub fn decode<S, E>(body: S) -> impl Stream<Item = anyhow::Result<TerminalEvent>>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    futures_util::stream::unfold(
        (body, BytesMut::new(), false),
        |(mut body, mut buffer, done)| async move {
            if done {
                return None;
            }
            loop {
                match next_frame(&mut buffer) {
                    Ok(Some((5, _))) => return None,
                    Ok(Some((kind, payload))) => {
                        if let Some(event) = event_of(kind, payload) {
                            return Some((Ok(event), (body, buffer, false)));
                        }
                        continue;
                    }
                    Ok(None) => {}
                    Err(error) => return Some((Err(error), (body, buffer, true))),
                }
                match body.next().await {
                    Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                    Some(Err(error)) => {
                        return Some((Err(anyhow::Error::new(error)), (body, buffer, true)));
                    }
                    None => return None,
                }
            }
        },
    )
}

/// The next whole frame in `buffer`, taken out of it.
fn next_frame(buffer: &mut BytesMut) -> anyhow::Result<Option<(u8, Bytes)>> {
    if buffer.len() < 5 {
        return Ok(None);
    }
    let length = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
    anyhow::ensure!(length <= MAX_FRAME, "a terminal frame of {length} bytes");
    if buffer.len() < 5 + length {
        return Ok(None);
    }
    let kind = buffer[0];
    buffer.advance(5);
    Ok(Some((kind, buffer.split_to(length).freeze())))
}

fn event_of(kind: u8, payload: Bytes) -> Option<TerminalEvent> {
    match kind {
        4 => Some(TerminalEvent::Output(payload)),
        1 => {
            let value: serde_json::Value = serde_json::from_slice(&payload).ok()?;
            if let Some(offset) = value.pointer("/pty_lag/offset").and_then(|v| v.as_u64()) {
                return Some(TerminalEvent::Lag(offset));
            }
            let code = value.pointer("/exit/code").and_then(|v| v.as_i64())?;
            Some(TerminalEvent::Exit(i32::try_from(code).unwrap_or(-1)))
        }
        _ => None,
    }
}

/// What a ticket lets its bearer attach to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TicketGrant {
    pub team_id: Uuid,
    pub sandbox: Uuid,
    pub session: u32,
}

fn ticket_key(state: &AppState, ticket: &str) -> String {
    format!("{}pty-ticket:{ticket}", state.settings.redis.key_prefix)
}

/// A new single-use ticket for `grant`, valid for [`TICKET_SECS`].
pub async fn issue_ticket(state: &AppState, grant: &TicketGrant) -> ApiResult<String> {
    let mut random = [0u8; 24];
    rand::rng().fill_bytes(&mut random);
    let ticket: String = random.iter().map(|byte| format!("{byte:02x}")).collect();
    let value = serde_json::to_string(grant).map_err(|error| ApiError::Internal(error.into()))?;
    let mut redis = state.redis.clone();
    redis::cmd("SET")
        .arg(ticket_key(state, &ticket))
        .arg(value)
        .arg("EX")
        .arg(TICKET_SECS)
        .query_async::<()>(&mut redis)
        .await
        .map_err(|error| ApiError::Unavailable(format!("redis: {error}")))?;
    Ok(ticket)
}

/// Redeems a ticket (once: it is deleted as it is read); `None` when it is unknown, used
/// or expired.
pub async fn redeem_ticket(state: &AppState, ticket: &str) -> ApiResult<Option<TicketGrant>> {
    if ticket.len() != 48 || !ticket.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let mut redis = state.redis.clone();
    let value: Option<String> = redis::cmd("GETDEL")
        .arg(ticket_key(state, ticket))
        .query_async(&mut redis)
        .await
        .map_err(|error| ApiError::Unavailable(format!("redis: {error}")))?;
    Ok(value.and_then(|value| serde_json::from_str(&value).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![kind];
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    #[tokio::test]
    async fn frames_split_anywhere_decode_to_the_same_events() {
        let mut stream = Vec::new();
        stream.extend(frame(4, b"hello "));
        stream.extend(frame(1, br#"{"pty_lag":{"offset":42}}"#));
        stream.extend(frame(4, b"world"));
        stream.extend(frame(
            1,
            br#"{"exit":{"code":3,"signal":null,"timed_out":false,"duration_ms":0}}"#,
        ));
        stream.extend(frame(5, b""));
        stream.extend(frame(4, b"after the end"));
        for split in [1, 2, 3, 7, stream.len()] {
            let chunks: Vec<Result<Bytes, std::io::Error>> = stream
                .chunks(split)
                .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
                .collect();
            let events: Vec<TerminalEvent> = decode(futures_util::stream::iter(chunks))
                .map(|event| event.unwrap())
                .collect()
                .await;
            assert_eq!(
                events,
                vec![
                    TerminalEvent::Output(Bytes::from_static(b"hello ")),
                    TerminalEvent::Lag(42),
                    TerminalEvent::Output(Bytes::from_static(b"world")),
                    TerminalEvent::Exit(3),
                ],
                "split every {split}"
            );
        }
    }
}
