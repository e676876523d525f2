//! The code endpoint on the base template (Debian's python3): a variable lives on between
//! calls, an exception and an interrupt leave the context as it was, an image shown comes
//! back as a PNG, output streams as it comes, contexts are made and
//! deleted, another team reaches none of it.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sandbase_worker::service::TemplateSource;
use serde_json::{Value, json};

use crate::testbed::{TestSandbox, TestWorker, sandbox_app, worker_config};

async fn run(sandbox: &TestSandbox<'_>, body: Value) -> Value {
    let answer = sandbox.post("/code", body.clone()).await;
    assert_eq!(answer.status, StatusCode::OK, "{body}: {}", answer.body);
    answer.body
}

#[tokio::test(flavor = "multi_thread")]
async fn code_contexts_keep_their_state_through_exceptions_and_interrupts() {
    let app = sandbox_app().await;
    let mut config = worker_config(&app, "code", 2, 0);
    let tarball = std::env::var("SANDBASE_BASE_TARBALL")
        .expect("SANDBASE_BASE_TARBALL: the base root file system (scripts/setup builds it)");
    config
        .templates
        .push(("base".to_owned(), TemplateSource::Tarball(tarball.into())));
    let worker = TestWorker::start(config).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let sandbox = TestSandbox::create(
        &app,
        &alice.api_key.token,
        json!({ "template": "base", "resources": { "memory_mb": 512 } }),
    )
    .await;

    // State carries over; the last expression is the main result.
    let first = run(&sandbox, json!({ "code": "x = 41\nprint('hi')\nx + 1" })).await;
    assert_eq!(
        (&first["stdout"], &first["main"]["text/plain"]),
        (&json!("hi\n"), &json!("42")),
        "{first}"
    );
    // An exception is the call's; the context keeps x.
    let failed = run(
        &sandbox,
        json!({ "code": "x += 1\nraise ValueError('bad')" }),
    )
    .await;
    assert_eq!(failed["exception"]["name"], "ValueError", "{failed}");
    assert!(
        failed["exception"]["traceback"]
            .as_str()
            .unwrap()
            .contains("<code>")
    );
    assert!(
        !failed["exception"]["traceback"]
            .as_str()
            .unwrap()
            .contains("kernel"),
        "{failed}"
    );
    assert_eq!(
        run(&sandbox, json!({ "code": "x" })).await["main"]["text/plain"],
        "42"
    );

    // An interrupt (a timeout here) raises KeyboardInterrupt; the context goes on.
    let started = Instant::now();
    let slow = run(
        &sandbox,
        json!({ "code": "import time\ny = 7\ntime.sleep(60)", "timeout_secs": 1 }),
    )
    .await;
    assert_eq!(
        (&slow["exception"]["name"], &slow["timed_out"]),
        (&json!("KeyboardInterrupt"), &json!(true)),
        "{slow}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        run(&sandbox, json!({ "code": "x + y" })).await["main"]["text/plain"],
        "49"
    );

    // A value with an image shows as one (matplotlib's figures take this way when the
    // template has matplotlib); output of a subprocess is the call's too.
    let image = r#"import struct, subprocess, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
class Dot:
    def _repr_png_(self):
        header = struct.pack('>IIBBBBB', 1, 1, 8, 0, 0, 0, 0)
        return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(b'\x00\x7f')) + chunk(b'IEND', b'')
subprocess.run(['echo', 'from a child'])
display(Dot())"#;
    let shown = run(&sandbox, json!({ "code": image })).await;
    let png = shown["results"][0]["image/png"]
        .as_str()
        .unwrap_or_default();
    assert!(png.starts_with("iVBORw0KGgo"), "a PNG: {shown}");
    assert!(
        shown["stdout"].as_str().unwrap().contains("from a child"),
        "{shown}"
    );

    streams_and_contexts(&sandbox).await;
    others_reach_nothing(&app, &sandbox).await;
    worker.clean_up_with(&["base"]).await;
}

async fn streams_and_contexts(sandbox: &TestSandbox<'_>) {
    let app = sandbox.app;
    let response = app
        .http
        .post(format!("{}{}", app.address, sandbox.path("/code")))
        .bearer_auth(&sandbox.token)
        .json(&json!({ "code": "for i in range(3): print(i)\ndisplay(1)\n'end'", "stream": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let body = response.bytes().await.unwrap();
    let lines: Vec<Value> = std::str::from_utf8(&body)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let stdout: String = lines
        .iter()
        .filter_map(|line| line["stdout"].as_str())
        .collect();
    assert_eq!(stdout, "0\n1\n2\n");
    assert!(
        lines
            .iter()
            .any(|line| line["result"]["text/plain"] == "1" && line["main"] == false)
    );
    assert!(
        lines
            .iter()
            .any(|line| line["result"]["text/plain"] == "'end'" && line["main"] == true)
    );
    assert!(
        lines.last().unwrap()["done"]["execution_count"]
            .as_u64()
            .unwrap()
            > 1
    );

    // A context of its own: its own variables, in its own directory.
    let made = sandbox
        .post("/code/contexts", json!({ "cwd": "/tmp" }))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let context = made.body["id"].as_str().unwrap().to_owned();
    let other = run(
        sandbox,
        json!({ "code": "import os\nprint(os.getcwd())\n'x' in globals()", "context": context }),
    )
    .await;
    assert_eq!(
        (&other["stdout"], &other["main"]["text/plain"]),
        (&json!("/tmp\n"), &json!("False")),
        "{other}"
    );
    let listed = sandbox.get("/code/contexts").await;
    assert_eq!(
        listed.body["contexts"].as_array().unwrap().len(),
        2,
        "{}",
        listed.body
    );
    assert_eq!(
        sandbox
            .delete(&format!("/code/contexts/{context}"))
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let gone = sandbox
        .post("/code", json!({ "code": "1", "context": context }))
        .await;
    assert_eq!(
        (gone.status, gone.code()),
        (StatusCode::NOT_FOUND, "context_not_found")
    );
    let bad = sandbox
        .post("/code", json!({ "code": "1", "context": "../x" }))
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    let empty = sandbox
        .post("/code", json!({ "code": "1", "timeout_secs": 0 }))
        .await;
    assert_eq!(empty.status, StatusCode::UNPROCESSABLE_ENTITY);
}

async fn others_reach_nothing(app: &crate::helpers::TestApp, sandbox: &TestSandbox<'_>) {
    let mallory = app.signup("mallory@example.com", "Mallory").await;
    let token = &mallory.api_key.token;
    let read = app
        .post(&sandbox.path("/code"), token, json!({ "code": "x" }))
        .await;
    assert_eq!(read.status, StatusCode::NOT_FOUND);
    let interrupt = app
        .post(
            &sandbox.path("/code/contexts/default/interrupt"),
            token,
            json!({}),
        )
        .await;
    assert_eq!(interrupt.status, StatusCode::NOT_FOUND);
    assert_eq!(
        run(sandbox, json!({ "code": "x" })).await["main"]["text/plain"],
        "42"
    );
}
