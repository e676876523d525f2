//! The code endpoint: Python run in a context whose state lives on between calls, its
//! output streamed and its results rich (text, images, HTML), as a notebook shows them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::sandboxes::RunAs;

/// The context a call names none: made on first use.
pub const DEFAULT_CONTEXT: &str = "default";

/// A context's id: 1 to 64 letters, digits, `.`, `_` or `-`.
pub fn valid_context_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeRequest {
    /// Python source. The value of a last expression is the call's main result.
    pub code: String,
    /// The context to run in (its variables, imports and working directory carry over);
    /// `default` when none is named, made on first use.
    #[serde(default)]
    pub context: Option<String>,
    /// Interrupt the code (KeyboardInterrupt, the context kept) after this many seconds
    /// (default 300, at most 86 400).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Answer with an NDJSON stream of [`CodeEvent`]s as they come.
    #[serde(default)]
    pub stream: bool,
}

/// A result as a notebook shows it: MIME type → content (`text/plain` always; `image/png`
/// base64, `text/html`, `image/svg+xml` when the value has them).
pub type MimeBundle = BTreeMap<String, String>;

/// An exception the code raised (KeyboardInterrupt when interrupted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CodeException {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CodeDone {
    /// The context's count of executions so far.
    pub execution_count: u64,
    pub duration_ms: u64,
    /// Interrupted for its `timeout_secs`.
    pub timed_out: bool,
}

/// One line of a streamed call: output chunks, results (`display()`, a shown figure, the
/// last expression's value with `main: true`), an exception, and `done` last (or
/// `{"error":{…}}` when the context itself broke).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum CodeEvent {
    Stdout {
        stdout: String,
    },
    Stderr {
        stderr: String,
    },
    Result {
        #[schema(value_type = BTreeMap<String, String>)]
        result: MimeBundle,
        main: bool,
    },
    Exception {
        exception: CodeException,
    },
    Done {
        done: CodeDone,
    },
    Error {
        error: crate::ErrorDetail,
    },
}

/// A whole call's answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct CodeResult {
    pub stdout: String,
    pub stderr: String,
    /// Every result in order; the last expression's value is the one with `main`.
    #[schema(value_type = Vec<BTreeMap<String, String>>)]
    pub results: Vec<MimeBundle>,
    /// The last expression's value (also in `results`), when the code ended with one.
    #[serde(default)]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub main: Option<MimeBundle>,
    #[serde(default)]
    pub exception: Option<CodeException>,
    pub execution_count: u64,
    pub duration_ms: u64,
    pub timed_out: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCodeContextRequest {
    /// Its working directory (default the sandbox's).
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub user: RunAs,
}

/// A code context: a Python interpreter whose state lives on between calls.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CodeContext {
    pub id: String,
    pub user: RunAs,
    /// Its interpreter's process.
    pub pid: u32,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CodeContextList {
    pub contexts: Vec<CodeContext>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_events_have_their_shapes() {
        let line = r#"{"result":{"text/plain":"42"},"main":true}"#;
        let event: CodeEvent = serde_json::from_str(line).expect("a result");
        assert!(matches!(event, CodeEvent::Result { main: true, .. }));
        let done: CodeEvent = serde_json::from_str(
            r#"{"done":{"execution_count":2,"duration_ms":3,"timed_out":false}}"#,
        )
        .expect("done");
        assert!(matches!(done, CodeEvent::Done { .. }));
        assert!(valid_context_id("default") && !valid_context_id("a/b"));
    }
}
