//! `sandbase replay RECORDING`: plays a terminal session's recording (asciicast v2) in your
//! terminal, at its own pace (or faster), long pauses shortened.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use futures_util::StreamExt;
use reqwest::Method;
use uuid::Uuid;

use crate::args::GlobalArgs;
use crate::client::Client;

#[derive(Args)]
pub struct ReplayArgs {
    recording: Uuid,
    /// Play this many times faster.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Pauses longer than this many seconds are shortened to it.
    #[arg(long, default_value_t = 2.0)]
    max_idle: f64,
    /// Print the recording as it is (asciicast v2) instead of playing it.
    #[arg(long)]
    raw: bool,
}

pub async fn replay(global: &GlobalArgs, args: ReplayArgs) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    let answer = client
        .stream(
            Method::GET,
            &format!("/v1/recordings/{}", args.recording),
            &[],
            None,
            None,
        )
        .await?;
    let mut body = answer.bytes_stream();
    let mut stdout = std::io::stdout();
    let mut pending = Vec::new();
    let (mut header_seen, mut clock) = (false, 0.0f64);
    let speed = if args.speed > 0.0 { args.speed } else { 1.0 };
    while let Some(chunk) = body.next().await {
        pending.extend_from_slice(&chunk?);
        while let Some(end) = pending.iter().position(|byte| *byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if args.raw {
                stdout.write_all(&line)?;
                continue;
            }
            if !header_seen {
                header_seen = true;
                continue;
            }
            let Ok(serde_json::Value::Array(event)) = serde_json::from_slice(&line) else {
                continue;
            };
            let (Some(at), Some(code), Some(text)) = (
                event.first().and_then(serde_json::Value::as_f64),
                event.get(1).and_then(serde_json::Value::as_str),
                event.get(2).and_then(serde_json::Value::as_str),
            ) else {
                continue;
            };
            let wait = ((at - clock).max(0.0)).min(args.max_idle.max(0.0)) / speed;
            clock = at;
            if code == "o" {
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
                stdout.write_all(text.as_bytes())?;
                stdout.flush()?;
            }
        }
    }
    Ok(())
}
