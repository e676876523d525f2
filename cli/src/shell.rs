//! `sandbase sandbox shell` and `attach`: your terminal on a terminal session of a sandbox.
//! Raw mode while attached, the size followed on `SIGWINCH`, Ctrl-] to detach (the session
//! goes on; `attach` brings you back to it, its last output replayed).

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::process::ExitCode;

use futures_util::StreamExt;
use reqwest::Method;
use sandbase_api::terminals::{OpenTerminalRequest, ResizeRequest, Terminal};
use tokio::io::AsyncReadExt;
use uuid::Uuid;

use crate::client::Client;

/// The key that detaches: Ctrl-].
const DETACH: u8 = 0x1d;

/// Your terminal's mode before raw mode, put back when dropped.
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return RawMode(None);
        }
        let Ok(saved) = rustix::termios::tcgetattr(stdin.as_fd()) else {
            return RawMode(None);
        };
        let mut raw = saved.clone();
        raw.make_raw();
        let set =
            rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw);
        RawMode(set.ok().map(|()| saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = rustix::termios::tcsetattr(
                std::io::stdin().as_fd(),
                rustix::termios::OptionalActions::Now,
                saved,
            );
        }
    }
}

/// Your terminal's size, when there is one.
fn terminal_size() -> Option<(u16, u16)> {
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return None;
    }
    let size = rustix::termios::tcgetwinsize(stdout.as_fd()).ok()?;
    (size.ws_col > 0 && size.ws_row > 0).then_some((size.ws_col, size.ws_row))
}

/// Opens a session (`cmd`, or a shell) and attaches to it.
pub async fn shell(client: &Client, id: Uuid, cmd: Vec<String>) -> anyhow::Result<ExitCode> {
    let (cols, rows) = terminal_size().unwrap_or((80, 24));
    let request = OpenTerminalRequest {
        cols,
        rows,
        cmd: (!cmd.is_empty()).then_some(cmd),
        cwd: None,
        env: Default::default(),
        user: Default::default(),
        idle_timeout_secs: None,
        record: true,
        record_input: None,
        recording: None,
    };
    let opened: Terminal = client
        .post(&format!("/v1/sandboxes/{id}/pty"), &request)
        .await?;
    attach(client, id, opened.session_id).await
}

/// Attaches to a session until it ends (its exit code is yours) or you detach.
pub async fn attach(client: &Client, id: Uuid, session: u32) -> anyhow::Result<ExitCode> {
    let base = format!("/v1/sandboxes/{id}/pty/{session}");
    // From the oldest output the sandbox still keeps: the screen comes back.
    let output = client
        .stream(Method::GET, &format!("{base}/output"), &[], None, None)
        .await?;
    let interactive = std::io::stdin().is_terminal();
    let raw = RawMode::enter();
    if let Some((cols, rows)) = terminal_size() {
        resize(client, &base, cols, rows).await;
    }
    let mut printing = tokio::spawn(async move {
        let mut body = output.bytes_stream();
        let mut stdout = std::io::stdout();
        while let Some(Ok(chunk)) = body.next().await {
            if stdout
                .write_all(&chunk)
                .and_then(|()| stdout.flush())
                .is_err()
            {
                break;
            }
        }
    });
    let mut stdin = tokio::io::stdin();
    let mut window = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut buffer = vec![0u8; 4096];
    let mut input_open = true;
    let detached = loop {
        tokio::select! {
            _ = &mut printing => break false,
            _ = window.recv() => {
                if let Some((cols, rows)) = terminal_size() {
                    resize(client, &base, cols, rows).await;
                }
            }
            read = stdin.read(&mut buffer), if input_open => {
                let typed = match read {
                    Ok(0) | Err(_) => {
                        // Input ended (a pipe): the output still comes until the session ends.
                        input_open = false;
                        continue;
                    }
                    Ok(read) => &buffer[..read],
                };
                if interactive && let Some(at) = typed.iter().position(|byte| *byte == DETACH) {
                    send(client, &base, &typed[..at]).await?;
                    break true;
                }
                send(client, &base, typed).await?;
            }
        }
    };
    drop(raw);
    printing.abort();
    if detached {
        eprintln!("\r\ndetached; back with: sandbase sandbox attach {id} {session}");
        return Ok(ExitCode::SUCCESS);
    }
    let ended: Terminal = client.get(&base, &[]).await?;
    let code = ended.exit_code.unwrap_or(0);
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

async fn send(client: &Client, base: &str, bytes: &[u8]) -> anyhow::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    client
        .stream(
            Method::POST,
            &format!("{base}/input"),
            &[],
            Some(bytes.to_vec().into()),
            None,
        )
        .await
        .map(drop)
}

async fn resize(client: &Client, base: &str, cols: u16, rows: u16) {
    let size = serde_json::to_value(ResizeRequest { cols, rows }).unwrap_or_default();
    let _ = client
        .stream(
            Method::POST,
            &format!("{base}/resize"),
            &[],
            None,
            Some(&size),
        )
        .await;
}
