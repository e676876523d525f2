//! Named commands (`exec_id`), the primitives an agent loop stands on: a command outlives
//! its caller's connection and is read again from any byte offset, a second start of the
//! same id runs nothing, cancel interrupts a command (in a shell session, the session goes
//! on where it was), a session's command streams, the output ring keeps the last MiB.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::testbed::{TestSandbox, TestWorker, sandbox_app, wait_until, worker_config};

/// The NDJSON lines of a streamed answer.
fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).expect("an NDJSON line"))
        .collect()
}

/// Output text of NDJSON lines, checking each chunk starts where the last one ended.
fn joined(lines: &[Value], mut offset: u64) -> (String, u64) {
    let mut text = String::new();
    for line in lines {
        let chunk = line["stdout"].as_str().or(line["stderr"].as_str());
        if let Some(chunk) = chunk {
            assert_eq!(line["offset"].as_u64(), Some(offset), "{line}");
            offset += chunk.len() as u64;
            text.push_str(chunk);
        }
    }
    (text, offset)
}

async fn status(sandbox: &TestSandbox<'_>, exec_id: &str, offset: u64) -> Value {
    let answer = sandbox
        .get(&format!("/execs/{exec_id}?offset={offset}"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body
}

async fn ended(sandbox: &TestSandbox<'_>, exec_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = status(sandbox, exec_id, 0).await;
        if last["running"] == false {
            return last;
        }
        assert!(Instant::now() < deadline, "still running: {last}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn named_commands_outlive_their_caller_and_are_cancelled_without_ending_the_session() {
    let app = sandbox_app().await;
    let worker = TestWorker::start(worker_config(&app, "x", 2, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let sandbox = TestSandbox::create(&app, &alice.api_key.token, json!({})).await;

    outlives_its_connection_and_runs_once(&sandbox).await;
    reattaches_from_an_offset(&sandbox).await;
    cancel_interrupts_and_the_session_goes_on(&sandbox).await;
    session_commands_stream_as_they_run(&sandbox).await;
    the_ring_keeps_the_last_mebibyte(&sandbox).await;
    bad_input_and_other_teams(&app, &sandbox).await;
    worker.clean_up().await;
}

/// The caller drops its stream after the first line; the command goes on to its end, its
/// output kept; starting the same id again answers that command and runs nothing.
async fn outlives_its_connection_and_runs_once(sandbox: &TestSandbox<'_>) {
    let command = "echo x >> /work/.count; for i in $(seq 1 20); do echo line $i; sleep 0.05; done; echo bye >&2";
    let body = json!({ "command": command, "exec_id": "step-1", "stream": true });
    let app = sandbox.app;
    let response = app
        .http
        .post(format!("{}{}", app.address, sandbox.path("/exec")))
        .bearer_auth(&sandbox.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.bytes_stream();
    let first = stream.next().await.expect("a first line").unwrap();
    let first = lines(std::str::from_utf8(&first).unwrap());
    assert_eq!(first[0]["exec_id"], "step-1", "{first:?}");
    assert!(first[0]["pid"].as_u64().is_some(), "{first:?}");
    drop(stream);

    let done = ended(sandbox, "step-1").await;
    assert_eq!(done["exit_code"], 0, "{done}");
    let output: Vec<Value> = done["output"].as_array().unwrap().clone();
    let stdout: String = output
        .iter()
        .filter(|chunk| chunk["stream"] == "stdout")
        .map(|chunk| chunk["text"].as_str().unwrap())
        .collect();
    let expected: String = (1..=20).map(|i| format!("line {i}\n")).collect();
    assert_eq!(stdout, expected);
    assert!(
        output
            .iter()
            .any(|chunk| chunk["stream"] == "stderr" && chunk["text"] == "bye\n")
    );
    assert_eq!(done["next_offset"], expected.len() + 4);

    // Again, whole: the first command's result, and the count in the sandbox still 1.
    let again = sandbox
        .exec(json!({ "command": command, "exec_id": "step-1" }))
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(
        (&again.body["stdout"], &again.body["exec_id"]),
        (&json!(expected), &json!("step-1"))
    );
    assert_eq!(sandbox.sh("wc -l < /work/.count").await["stdout"], "1\n");
    // Another command under a kept id is refused.
    let other = sandbox
        .exec(json!({ "command": "echo other", "exec_id": "step-1" }))
        .await;
    assert_eq!(
        (other.status, other.code()),
        (StatusCode::CONFLICT, "exec_id_in_use")
    );
}

/// A reader that lost its stream goes on from the offset it reached, and sees each byte
/// once: the JSON page and the followed stream agree.
async fn reattaches_from_an_offset(sandbox: &TestSandbox<'_>) {
    let app = sandbox.app;
    let response = app
        .http
        .post(format!("{}{}", app.address, sandbox.path("/exec")))
        .bearer_auth(&sandbox.token)
        .json(&json!({
            "command": "for i in $(seq 1 10); do echo tick $i; echo tock $i >&2; sleep 0.1; done",
            "exec_id": "ticks", "stream": true, "record": false,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let page = status(sandbox, "ticks", 0).await;
    assert_eq!(page["running"], true, "{page}");
    let (mut text, mut offset) = (String::new(), 0u64);
    for chunk in page["output"].as_array().unwrap() {
        assert_eq!(chunk["offset"].as_u64(), Some(offset));
        offset += chunk["text"].as_str().unwrap().len() as u64;
        text.push_str(chunk["text"].as_str().unwrap());
    }
    assert_eq!(page["next_offset"].as_u64(), Some(offset));
    let (_, body, _) = sandbox
        .raw(
            reqwest::Method::GET,
            &format!("/execs/ticks?offset={offset}&stream=true"),
            None,
        )
        .await;
    let followed = lines(std::str::from_utf8(&body).unwrap());
    let (rest, _) = joined(&followed, offset);
    text.push_str(&rest);
    assert_eq!(followed.last().unwrap()["exit_code"], 0, "{followed:?}");
    let expected: usize = (1..=10)
        .map(|i| format!("tick {i}\ntock {i}\n").len())
        .sum();
    assert_eq!(text.len(), expected, "{text}");
    for i in 1..=10 {
        assert!(text.contains(&format!("tick {i}\n")) && text.contains(&format!("tock {i}\n")));
    }
}

/// Cancel: a plain command is interrupted at once; a session's command too, its shell
/// left alive with the directory the command changed to.
async fn cancel_interrupts_and_the_session_goes_on(sandbox: &TestSandbox<'_>) {
    let started = Instant::now();
    let app = sandbox.app;
    let post = app
        .http
        .post(format!("{}{}", app.address, sandbox.path("/exec")))
        .bearer_auth(&sandbox.token)
        .json(&json!({ "command": "sleep 600", "exec_id": "long" }))
        .send();
    let waiting = tokio::spawn(post);
    wait_until("the command to start", Duration::from_secs(10), || async {
        sandbox.get("/execs/long").await.body["pid"].is_u64()
    })
    .await;
    let cancelled = sandbox.post("/execs/long/cancel", json!({})).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.body);
    assert_eq!(cancelled.body["cancelled"], true);
    let answer: Value = waiting.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(answer["signal"], 2, "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let session = tokio::spawn(
        app.http
            .post(format!("{}{}", app.address, sandbox.path("/exec")))
            .bearer_auth(&sandbox.token)
            .json(&json!({ "command": "cd /tmp && touch /work/.slept && sleep 600", "session": "main", "exec_id": "in-session" }))
            .send(),
    );
    wait_until("the sleep to start", Duration::from_secs(10), || async {
        sandbox.sh("test -e /work/.slept").await["exit_code"] == 0
    })
    .await;
    let cancelled = sandbox.post("/execs/in-session/cancel", json!({})).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.body);
    let answer: Value = session.await.unwrap().unwrap().json().await.unwrap();
    assert_ne!(answer["exit_code"], 0, "{answer}");
    let pwd = sandbox
        .exec(json!({ "command": "pwd", "session": "main" }))
        .await;
    assert_eq!(pwd.body["stdout"], "/tmp\n", "{}", pwd.body);
    // Cancelling what ended changes nothing.
    let again = sandbox.post("/execs/in-session/cancel", json!({})).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["exit_code"], answer["exit_code"]);
}

/// A session's command streams: its first line arrives while it still runs, and no marker
/// of the session's shell shows.
async fn session_commands_stream_as_they_run(sandbox: &TestSandbox<'_>) {
    let app = sandbox.app;
    let started = Instant::now();
    let response = app
        .http
        .post(format!("{}{}", app.address, sandbox.path("/exec")))
        .bearer_auth(&sandbox.token)
        .json(&json!({ "command": "echo first; sleep 2; echo second; pwd", "session": "main", "stream": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    let mut first_at = None;
    while let Some(bytes) = stream.next().await {
        text.push_str(std::str::from_utf8(&bytes.unwrap()).unwrap());
        if first_at.is_none() && text.contains("first") {
            first_at = Some(started.elapsed());
        }
    }
    assert!(
        first_at.expect("the first line") < Duration::from_millis(1500),
        "{text}"
    );
    let all = lines(&text);
    let (output, _) = joined(&all, 0);
    assert_eq!(output, "first\nsecond\n/tmp\n");
    assert_eq!(all.last().unwrap()["exit_code"], 0);
    assert!(!text.contains("SANDBASE_END"), "{text}");
}

/// The last MiB of a command's output is kept; older bytes are dropped and said to be.
async fn the_ring_keeps_the_last_mebibyte(sandbox: &TestSandbox<'_>) {
    let answer = sandbox
        .exec(json!({
            "command": "head -c 3145728 /dev/zero | tr '\\0' a; echo; echo end",
            "exec_id": "big", "record": false,
        }))
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body["truncated"], true);
    assert!(
        answer.body["stdout"]
            .as_str()
            .unwrap()
            .ends_with("aaa\nend\n")
    );
    let page = status(sandbox, "big", 0).await;
    let total = 3 * 1024 * 1024 + 5;
    assert_eq!(page["next_offset"], total);
    assert_eq!(page["offset"], total - 1024 * 1024);
    let kept: usize = page["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|chunk| chunk["text"].as_str().unwrap().len())
        .sum();
    assert_eq!(kept, 1024 * 1024);
}

async fn bad_input_and_other_teams(app: &crate::helpers::TestApp, sandbox: &TestSandbox<'_>) {
    let unknown = sandbox.get("/execs/nothing-here").await;
    assert_eq!(
        (unknown.status, unknown.code()),
        (StatusCode::NOT_FOUND, "exec_not_found")
    );
    let bad = sandbox.get("/execs/a%20b").await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.body);
    let background = sandbox
        .exec(json!({ "command": "true", "exec_id": "bg", "background": true }))
        .await;
    assert_eq!(background.status, StatusCode::UNPROCESSABLE_ENTITY);
    let bad_id = sandbox
        .exec(json!({ "command": "true", "exec_id": "../x" }))
        .await;
    assert_eq!(bad_id.status, StatusCode::UNPROCESSABLE_ENTITY);
    // Another team sees nothing and cancels nothing.
    let mallory = app.signup("mallory@example.com", "Mallory").await;
    let path = sandbox.path("/execs/step-1");
    let read = app.get(&path, &mallory.api_key.token).await;
    assert_eq!(read.status, StatusCode::NOT_FOUND);
    let cancel = app
        .post(&format!("{path}/cancel"), &mallory.api_key.token, json!({}))
        .await;
    assert_eq!(cancel.status, StatusCode::NOT_FOUND);
    assert_eq!(status(sandbox, "step-1", 0).await["cancelled"], false);
}
