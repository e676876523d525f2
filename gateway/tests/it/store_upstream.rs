//! The model providers' stand-in every suite shares (`tests/support/standin.py`: OpenAI chat
//! completions, Responses and embeddings, Anthropic messages and token counting, whole and
//! streamed, a paid API), started as a process the way the egress tests start their upstream:
//! `python3 -m tests.support.standin` from the workspace, its URL read from the line it
//! prints, its request log read over HTTP. It answers only to the operator's credentials;
//! what a request asks for is in its last message (`busy`, `broken`, `overloaded`, `slow`,
//! `no usage`: see the stand-in's text). Each lives until the test binary ends: its standard
//! input closes then, and it stops.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use serde_json::Value;

pub const OPENAI_SECRET: &str = "upstream-secret-openai";
pub const ANTHROPIC_SECRET: &str = "upstream-secret-anthropic";
pub const API_SECRET: &str = "upstream-secret-api&=?";
/// The body of the stand-in's 500 (`BROKEN` there).
pub const BROKEN: &str = r#"{"error":{"message":"broke","type":"server_error"}}"#;

/// The running stand-in: what it received, read back from its request log.
#[derive(Clone)]
pub struct Seen {
    url: String,
}

/// The stand-ins' processes: held (with their standard input open) until the binary ends.
static RUNNING: Mutex<Vec<Child>> = Mutex::new(Vec::new());

impl Seen {
    /// Every request it received (`{path, headers, body}`), in order.
    pub async fn all(&self) -> Vec<Value> {
        reqwest::get(format!("{}/_standin/requests", self.url))
            .await
            .expect("the stand-in's request log")
            .json()
            .await
            .expect("the request log is JSON")
    }

    /// The last request it received: its headers (names in lower case) and its body.
    pub async fn last(&self) -> (Value, Value) {
        let requests = self.all().await;
        let last = requests.last().expect("the stand-in received a request");
        (last["headers"].clone(), last["body"].clone())
    }
}

/// Starts a stand-in of its own for a test: its base URL, and its request log.
pub async fn start() -> (String, Seen) {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf();
    let (url, child) = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("python3")
            .args(["-m", "tests.support.standin"])
            .current_dir(workspace)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the stand-in (python3 -m tests.support.standin)");
        let stdout = child.stdout.take().expect("the stand-in's output");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the stand-in's first line");
        let ready: Value = serde_json::from_str(&line)
            .unwrap_or_else(|_| panic!("the stand-in did not start: {line:?}"));
        (ready["url"].as_str().expect("its URL").to_owned(), child)
    })
    .await
    .expect("starting the stand-in");
    RUNNING
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .push(child);
    (url.clone(), Seen { url })
}
