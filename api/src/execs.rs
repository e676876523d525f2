//! Commands in a sandbox: the request, its whole result, its streamed events, and commands a
//! caller names (`exec_id`), which run to their end whatever happens to the caller's
//! connection and are read again from a byte offset of their output.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::sandboxes::RunAs;

/// Longest `exec_id`.
pub const MAX_EXEC_ID: usize = 128;

/// An `exec_id`: 1 to 128 letters, digits, `.`, `_`, `:` or `-` (a UUID, `run-42`, …).
pub fn valid_exec_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_EXEC_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// The pattern of [`valid_exec_id`], for the OpenAPI document.
pub const EXEC_ID_PATTERN: &str = "^[A-Za-z0-9._:-]{1,128}$";

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The program and its arguments (no shell).
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// A shell command line, run with `/bin/sh -c`.
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: RunAs,
    /// Standard input (the command sees end of input after it).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Kill the command (and what it started) after this many seconds.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Answer with an NDJSON stream of [`ExecEvent`]s instead of one result.
    #[serde(default)]
    pub stream: bool,
    /// Start the command and answer at once with its pid; see `/processes`.
    #[serde(default)]
    pub background: bool,
    /// A shell session's name (1–64 letters, digits, `-`, `_`, `.`): the command runs in
    /// that session's bash, started on first use, so the working directory and exported
    /// variables carry over to the session's next command; the answer is still this
    /// command's own exit code, stdout and stderr (streamed with `stream`). `exit` ends the
    /// session, as does a timeout. A session is listed among the sandbox's `/processes`
    /// (`shell (session NAME)`); a signal to it ends it. At most 4 per sandbox; not with
    /// `background` or `stdin`.
    #[serde(default)]
    pub session: Option<String>,
    /// The caller's name for this command (1–128 letters, digits, `.`, `_`, `:`, `-`; unique
    /// in the sandbox while it is kept). A named command runs to its end even when the
    /// caller's connection drops, its output kept (the last MiB) for
    /// `GET …/execs/{exec_id}`, which reads it from any byte offset; `POST
    /// …/execs/{exec_id}/cancel` interrupts it. Starting the same `exec_id` again answers
    /// the first start's command (its stream from the beginning, or its whole result once
    /// it ends) and runs nothing; another command under a kept id is 409
    /// `exec_id_in_use`. Not with `background`.
    #[serde(default)]
    pub exec_id: Option<String>,
    /// Record the command and its output (asciicast, kept with the audit log; background
    /// processes are never recorded). `false` keeps no recording.
    #[serde(default = "record_by_default")]
    pub record: bool,
}

fn record_by_default() -> bool {
    true
}

/// What an absent field means, as for a request body that leaves it out: the command is
/// recorded unless `record` says otherwise.
impl Default for ExecRequest {
    fn default() -> Self {
        ExecRequest {
            cmd: None,
            command: None,
            env: BTreeMap::new(),
            cwd: None,
            user: RunAs::default(),
            stdin: None,
            timeout_secs: None,
            stream: false,
            background: false,
            session: None,
            exec_id: None,
            record: record_by_default(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    pub exit_code: i32,
    /// The signal that ended the command, if one did.
    #[serde(default)]
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    /// True when output beyond the server's cap was dropped.
    #[serde(default)]
    pub truncated: bool,
    pub duration_ms: u64,
    /// The command's `exec_id`, when it was started with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_id: Option<String>,
}

/// One line of a streamed command: `{"pid":N}` first, then `{"stdout":"…"}` and
/// `{"stderr":"…"}` chunks, and last `{"exit_code":N,…}` (or `{"error":{…}}`). A named
/// command's lines carry its `exec_id` (first line) and each chunk's byte `offset` in the
/// command's output, from which `GET …/execs/{exec_id}?offset=N` reads on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ExecEvent {
    Started {
        pid: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exec_id: Option<String>,
    },
    Stdout {
        stdout: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
    },
    Stderr {
        stderr: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
    },
    Exit {
        exit_code: i32,
        #[serde(default)]
        signal: Option<i32>,
        timed_out: bool,
        duration_ms: u64,
    },
    Error {
        error: crate::ErrorDetail,
    },
}

impl ExecEvent {
    /// A chunk of standard output, outside any named command.
    pub fn stdout(text: String) -> ExecEvent {
        ExecEvent::Stdout {
            stdout: text,
            offset: None,
        }
    }

    /// A chunk of standard error, outside any named command.
    pub fn stderr(text: String) -> ExecEvent {
        ExecEvent::Stderr {
            stderr: text,
            offset: None,
        }
    }
}

/// Which stream a piece of output came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// A piece of a named command's output, at its byte offset in the command's output (both
/// streams, in the order they were written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OutputChunk {
    pub stream: OutputStream,
    pub offset: u64,
    pub text: String,
}

/// A named command (`exec_id`) and its output from an offset.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecStatus {
    pub exec_id: String,
    /// The program and its arguments (`/bin/sh -c LINE` for a command line).
    pub cmd: Vec<String>,
    /// The shell session it ran in, if any.
    #[serde(default)]
    pub session: Option<String>,
    /// Its process (a session command's: the session's shell), once started.
    #[serde(default)]
    pub pid: Option<u32>,
    pub running: bool,
    /// Whether it was cancelled (`POST …/cancel`).
    pub cancelled: bool,
    /// Set once it ended.
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    pub timed_out: bool,
    #[serde(default)]
    pub duration_ms: Option<u64>,
    pub started_at: DateTime<Utc>,
    /// Where `output` starts: the offset asked for, or the oldest byte still kept when older
    /// output was dropped (the last MiB is kept).
    pub offset: u64,
    /// The offset after the last byte of output so far: the next read's `offset`.
    pub next_offset: u64,
    pub output: Vec<OutputChunk>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_events_have_the_documented_shapes() {
        let lines = [
            ExecEvent::Started {
                pid: 7,
                exec_id: None,
            },
            ExecEvent::stdout("hi\n".to_owned()),
            ExecEvent::Stderr {
                stderr: "oh".to_owned(),
                offset: Some(3),
            },
            ExecEvent::Exit {
                exit_code: 3,
                signal: None,
                timed_out: false,
                duration_ms: 4,
            },
        ];
        let encoded: Vec<String> = lines
            .iter()
            .map(|line| serde_json::to_string(line).expect("encode"))
            .collect();
        assert_eq!(encoded[0], r#"{"pid":7}"#);
        assert_eq!(encoded[1], r#"{"stdout":"hi\n"}"#);
        assert_eq!(encoded[2], r#"{"stderr":"oh","offset":3}"#);
        assert!(encoded[3].starts_with(r#"{"exit_code":3"#));
        for (line, event) in encoded.iter().zip(lines) {
            assert_eq!(
                serde_json::from_str::<ExecEvent>(line).expect("decode"),
                event
            );
        }
    }

    /// A request built in code means what the same request sent without those fields means.
    #[test]
    fn the_default_request_is_the_empty_body() {
        let empty: ExecRequest = serde_json::from_str("{}").expect("the empty body parses");
        assert_eq!(
            serde_json::to_value(ExecRequest::default()).ok(),
            serde_json::to_value(empty).ok()
        );
        assert!(ExecRequest::default().record);
    }

    #[test]
    fn exec_ids_are_short_and_plain() {
        assert!(valid_exec_id("run-42") && valid_exec_id("0b9f:3.x_y"));
        for bad in ["", "a b", "a/b", "..%2f", &"x".repeat(129), "é"] {
            assert!(!valid_exec_id(bad), "{bad}");
        }
    }
}
