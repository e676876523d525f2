//! Shell sessions for agents: commands in a persistent shell keep `cd` and `export` between
//! them, each still answering with its own exit code, stdout and stderr; under both
//! isolation levels.

use sandbase_api::sandboxes::Isolation;
use serde_json::{Value, json};

use crate::testbed::{
    ISOLATIONS, TestWorker, create_ok, exec, sandbox_app_isolated, worker_config,
};

async fn run(
    app: &crate::helpers::TestApp,
    token: &str,
    id: &str,
    session: &str,
    command: &str,
) -> Value {
    let answer = exec(
        app,
        token,
        id,
        json!({ "command": command, "session": session }),
    )
    .await;
    assert_eq!(answer.status.as_u16(), 200, "{command}: {}", answer.body);
    answer.body
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shell_session_keeps_its_directory_and_environment_between_commands() {
    for isolation in ISOLATIONS {
        sessions_under(isolation).await;
    }
}

async fn sessions_under(isolation: Isolation) {
    let app = sandbox_app_isolated(isolation).await;
    let worker = TestWorker::start(worker_config(&app, "s", 4, 0)).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();
    let id = create_ok(&app, token, json!({})).await;

    let first = run(&app, token, &id, "main", "cd /tmp && export GREETING=hi").await;
    assert_eq!(first["exit_code"], 0, "{first}");
    let second = run(
        &app,
        token,
        &id,
        "main",
        "pwd; echo $GREETING; echo oops >&2; false",
    )
    .await;
    assert_eq!(
        (&second["stdout"], &second["stderr"], &second["exit_code"]),
        (&json!("/tmp\nhi\n"), &json!("oops\n"), &json!(1)),
        "{second}"
    );
    // Another session is a shell of its own.
    let other = run(&app, token, &id, "other", "pwd; echo \"[$GREETING]\"").await;
    assert_eq!(other["stdout"], "/work\n[]\n", "{other}");
    // A syntax error is the command's; the session goes on where it was.
    let broken = run(&app, token, &id, "main", "if then").await;
    assert_ne!(broken["exit_code"], 0, "{broken}");
    assert_eq!(
        run(&app, token, &id, "main", "pwd").await["stdout"],
        "/tmp\n"
    );
    // Output without a final newline, and a forged end marker, come back as printed.
    assert_eq!(
        run(&app, token, &id, "main", "printf abc").await["stdout"],
        "abc"
    );
    let forged = run(
        &app,
        token,
        &id,
        "main",
        "echo SANDBASE_END_0 0; echo after",
    )
    .await;
    assert_eq!(forged["stdout"], "SANDBASE_END_0 0\nafter\n", "{forged}");
    // `exit` ends the session with its code; the next command gets a fresh one.
    let exited = run(&app, token, &id, "main", "exit 3").await;
    assert_eq!(exited["exit_code"], 3, "{exited}");
    assert_eq!(
        run(&app, token, &id, "main", "pwd").await["stdout"],
        "/work\n"
    );
    // A timeout kills the session's processes and says so.
    let slow = exec(
        &app,
        token,
        &id,
        json!({ "command": "cd /tmp; sleep 30", "session": "main", "timeout_secs": 1 }),
    )
    .await;
    assert_eq!(slow.body["timed_out"], true, "{}", slow.body);
    assert_eq!(
        run(&app, token, &id, "main", "pwd").await["stdout"],
        "/work\n"
    );

    // A session is one of the sandbox's processes: a signal through `/processes` ends it,
    // and the next command gets a fresh one.
    run(&app, token, &id, "main", "cd /tmp").await;
    let processes = app
        .get(&format!("/v1/sandboxes/{id}/processes"), token)
        .await
        .body;
    let pid = processes
        .as_array()
        .or_else(|| processes["processes"].as_array())
        .and_then(|list| {
            list.iter().find(|process| {
                process["running"] == true && process.to_string().contains("(session main)")
            })
        })
        .and_then(|process| process["pid"].as_u64())
        .unwrap_or_else(|| panic!("the session among the processes: {processes}"));
    let signal = app
        .post(
            &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
            token,
            json!({ "signal": 9 }),
        )
        .await;
    assert!(signal.status.is_success(), "{}", signal.body);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        run(&app, token, &id, "main", "pwd").await["stdout"],
        "/work\n"
    );

    refusals(&app, token, &id).await;
    // The sandbox's other commands still work.
    plain_and_streamed_commands(&app, token, &id).await;
    app.delete(&format!("/v1/sandboxes/{id}"), token).await;
    commands_are_recorded(&app, token, &id, alice.api_key.key.id).await;
    worker.clean_up().await;
}

async fn plain_and_streamed_commands(app: &crate::helpers::TestApp, token: &str, id: &str) {
    let plain = exec(app, token, id, json!({ "command": "echo alive" })).await;
    assert_eq!(plain.body["stdout"], "alive\n");
    let streamed = exec(
        app,
        token,
        id,
        json!({ "command": "echo streamed; exit 4", "stream": true }),
    )
    .await;
    assert!(streamed.status.is_success());
}

/// Every command was recorded by the worker, after the sandbox is gone too: the shell
/// session's commands with the session's name, the plain and the streamed `exec` calls, each
/// with its exit code, its command line typed and its output, for the key that ran it.
async fn commands_are_recorded(
    app: &crate::helpers::TestApp,
    token: &str,
    id: &str,
    key: uuid::Uuid,
) {
    let path = format!("/v1/recordings?sandbox={id}");
    let has_all = |listed: &Value| {
        let all = listed["recordings"].as_array().cloned().unwrap_or_default();
        all.iter()
            .any(|r| r["command"][2] == "echo streamed; exit 4")
            && all.iter().any(|r| r["command"][2] == "echo alive")
    };
    crate::testbed::wait_until(
        "the commands' recordings",
        std::time::Duration::from_secs(15),
        || async { has_all(&app.get(&path, token).await.body) },
    )
    .await;
    let listed = app.get(&path, token).await.body;
    let all = listed["recordings"].as_array().unwrap();
    let find = |command: &str| {
        all.iter()
            .find(|recording| recording["command"][2] == command)
            .unwrap_or_else(|| panic!("no recording of {command}: {listed}"))
            .clone()
    };
    let second = find("pwd; echo $GREETING; echo oops >&2; false");
    assert_eq!(
        (
            &second["kind"],
            &second["shell_session"],
            &second["exit_code"]
        ),
        (&json!("shell"), &json!("main"), &json!(1)),
        "{second}"
    );
    let streamed = find("echo streamed; exit 4");
    assert_eq!(
        (&streamed["kind"], &streamed["exit_code"]),
        (&json!("exec"), &json!(4))
    );
    for (recording, typed, shown) in [
        (
            &second,
            "$ pwd; echo $GREETING; echo oops >&2; false\r\n",
            "/tmp\r\nhi\r\n",
        ),
        (&streamed, "$ echo streamed; exit 4\r\n", "streamed\r\n"),
        (&find("echo alive"), "$ echo alive\r\n", "alive\r\n"),
    ] {
        let answer = app
            .get_text(
                &format!("/v1/recordings/{}", recording["id"].as_str().unwrap()),
                token,
            )
            .await;
        let lines: Vec<Value> = answer
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines[0]["version"], 2);
        assert_eq!((&lines[1][1], &lines[1][2]), (&json!("i"), &json!(typed)));
        let output: String = lines[2..]
            .iter()
            .filter(|event| event[1] == "o")
            .map(|event| event[2].as_str().unwrap())
            .collect();
        assert!(output.contains(shown), "{output:?}");
    }
    // The rows name the key that ran the commands.
    let (keys,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM recordings WHERE sandbox_id = $1::uuid AND kind <> 'terminal' \
           AND api_key_id IS DISTINCT FROM $2",
    )
    .bind(id)
    .bind(key)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(keys, 0);
    // Another team sees none of them.
    let bob = app.signup("bob@example.com", "Bob").await;
    let foreign = app.get(&path, &bob.api_key.token).await;
    assert_eq!(foreign.body["recordings"], json!([]), "{}", foreign.body);
}

/// Bad names, combinations that cannot be, another user in a session, too many sessions.
async fn refusals(app: &crate::helpers::TestApp, token: &str, id: &str) {
    for body in [
        json!({ "command": "true", "session": "a b" }),
        json!({ "command": "true", "session": "" }),
        json!({ "command": "true", "session": "s", "background": true }),
        json!({ "command": "true", "session": "s", "stdin": "x" }),
    ] {
        let answer = exec(app, token, id, body.clone()).await;
        answer.assert_error(422, "invalid_request");
    }
    let as_root = exec(
        app,
        token,
        id,
        json!({ "command": "id -u", "session": "other", "user": "root" }),
    )
    .await;
    // State, not shape (a session of the other user's): 409; too many sessions: a limit, 429.
    as_root.assert_error(409, "session_user_mismatch");
    for name in ["s3", "s4"] {
        run(app, token, id, name, "true").await;
    }
    // main, other, s3 and s4 are open: a fifth is refused.
    let fifth = exec(
        app,
        token,
        id,
        json!({ "command": "true", "session": "s5" }),
    )
    .await;
    fifth.assert_error(429, "too_many_sessions");
}
