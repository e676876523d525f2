//! Recordings of commands — `exec` calls and the commands of shell sessions — as asciicast
//! v2, made by the worker (never in the sandbox) like a terminal session's: the command line
//! as input, then its output as it came (stdout and stderr, line ends as a terminal shows
//! them), sent whole to the gateway once the command ended, in the background (the answer
//! does not wait for it). At most [`MAX_CAST`] bytes are kept; the rest is marked as cut.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbase_api::internal::{CommandRecording, RecordFor};
use uuid::Uuid;

use crate::recording::RecordingSink;
use crate::utf8::Utf8Carry;

/// Most bytes one command's recording holds.
pub const MAX_CAST: usize = 4 * 1024 * 1024 - 4096;

/// A command's recording as it goes.
pub struct CommandCast {
    started: Instant,
    lines: Vec<u8>,
    stdout: Utf8Carry,
    stderr: Utf8Carry,
    cut: bool,
    meta: CommandRecording,
}

/// How a command line is shown: the script of `sh -c SCRIPT`, else the words.
fn command_line(argv: &[String]) -> String {
    match argv {
        [shell, flag, script] if flag == "-c" && shell.ends_with("sh") => script.clone(),
        words => words.join(" "),
    }
}

impl CommandCast {
    /// `kind` is `exec` or `shell` (then `shell_session` names the session).
    pub fn start(
        sandbox: Uuid,
        kind: &str,
        argv: &[String],
        shell_session: Option<&str>,
        by: RecordFor,
    ) -> CommandCast {
        let header = serde_json::json!({
            "version": 2,
            "width": 80,
            "height": 24,
            "timestamp": chrono::Utc::now().timestamp(),
            "command": command_line(argv),
            "env": { "TERM": "xterm-256color" },
        });
        let mut cast = CommandCast {
            started: Instant::now(),
            lines: format!("{header}\n").into_bytes(),
            stdout: Utf8Carry::default(),
            stderr: Utf8Carry::default(),
            cut: false,
            meta: CommandRecording {
                sandbox,
                kind: kind.to_owned(),
                command: argv.to_vec(),
                shell_session: shell_session.map(str::to_owned),
                by,
                duration_ms: 0,
                exit_code: None,
            },
        };
        let typed = format!("$ {}\r\n", command_line(argv).replace('\n', "\r\n"));
        cast.event("i", &typed);
        cast
    }

    fn event(&mut self, code: &str, text: &str) {
        if text.is_empty() || self.cut {
            return;
        }
        let line = serde_json::json!([self.started.elapsed().as_secs_f64(), code, text]);
        let line = line.to_string();
        if self.lines.len() + line.len() >= MAX_CAST {
            self.cut = true;
            return;
        }
        self.lines.extend_from_slice(line.as_bytes());
        self.lines.push(b'\n');
    }

    /// Output as a terminal would show it: a line feed returns the carriage too.
    fn output(&mut self, text: &str) {
        let shown = text.replace("\r\n", "\n").replace('\n', "\r\n");
        self.event("o", &shown);
    }

    pub fn stdout(&mut self, bytes: &[u8]) {
        let text = self.stdout.push(bytes);
        self.output(&text);
    }

    pub fn stderr(&mut self, bytes: &[u8]) {
        let text = self.stderr.push(bytes);
        self.output(&text);
    }

    /// The command ended with `exit_code`: the recording is finished and sent.
    pub fn send(mut self, sink: Arc<RecordingSink>, exit_code: Option<i32>) {
        let (stdout, stderr) = (self.stdout.finish(), self.stderr.finish());
        self.output(&stdout);
        self.output(&stderr);
        if self.cut {
            self.cut = false;
            self.event(
                "o",
                "\r\n[sandbase: the rest of this output was not recorded]\r\n",
            );
        }
        self.meta.duration_ms = self.started.elapsed().as_millis() as u64;
        self.meta.exit_code = exit_code;
        tokio::spawn(async move {
            let id = Uuid::now_v7();
            for attempt in 1..=5u32 {
                match sink.put_whole(id, &self.meta, self.lines.clone()).await {
                    Ok(()) => return,
                    Err(error) if attempt == 5 => {
                        tracing::warn!(%id, error = format!("{error:#}"), "a command's recording was lost");
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(cast: &CommandCast) -> Vec<serde_json::Value> {
        String::from_utf8(cast.lines.clone())
            .unwrap()
            .lines()
            .skip(1)
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[test]
    fn a_command_is_recorded_as_its_line_typed_then_its_output_as_a_terminal_shows_it() {
        let argv = ["sh", "-c", "echo hi; echo oops >&2"].map(str::to_owned);
        let mut cast = CommandCast::start(Uuid::nil(), "exec", &argv, None, RecordFor::default());
        cast.stdout(b"hi\n");
        cast.stderr(b"oops\n");
        cast.stdout(&[0xc3]);
        cast.stdout(&[0xa9]);
        let events = events(&cast);
        assert_eq!(events[0][1], "i");
        assert_eq!(events[0][2], "$ echo hi; echo oops >&2\r\n");
        assert_eq!(events[1][2], "hi\r\n");
        assert_eq!(events[2][2], "oops\r\n");
        assert_eq!(events[3][2], "é");
        let header: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&cast.lines).lines().next().unwrap())
                .unwrap();
        assert_eq!(header["version"], 2);
    }

    #[test]
    fn a_recording_stops_at_its_cap() {
        let argv = ["yes".to_owned()];
        let mut cast = CommandCast::start(Uuid::nil(), "exec", &argv, None, RecordFor::default());
        let line = vec![b'y'; 64 * 1024];
        for _ in 0..200 {
            cast.stdout(&line);
        }
        assert!(cast.lines.len() < MAX_CAST);
        assert!(cast.cut);
    }
}
