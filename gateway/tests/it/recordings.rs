//! Recordings are storage like any other: metered while kept, held to the team's quota (a
//! command asking to be recorded past it is refused clearly, one that asks not to be is
//! not), deletable by admins; and a worker cannot overwrite another recording's content.

use std::time::Duration;

use reqwest::StatusCode;
use sandbase_api::internal::{CommandRecording, NODE_TOKEN_HEADER, RECORDING_HEADER, RecordFor};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{TestApp, spawn_app_with};
use crate::testbed::{TestWorker, configure_sandboxes, create_ok, exec, wait_until, worker_config};

async fn quota_app() -> TestApp {
    spawn_app_with(|settings| {
        configure_sandboxes(settings);
        settings.sandboxes.recording_quota_mb = 1;
        settings.runs.storage_meter_secs = 1;
        settings.runs.artifacts_dir =
            std::env::temp_dir().join(format!("sandbase-artifacts-{}", Uuid::new_v4().simple()));
    })
    .await
}

async fn recordings_of(app: &TestApp, token: &str, sandbox: &str) -> Vec<Value> {
    let listed = app
        .get(&format!("/v1/recordings?sandbox={sandbox}"), token)
        .await;
    listed.body["recordings"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn recordings_are_metered_and_held_to_the_teams_quota() {
    let app = quota_app().await;
    let worker = TestWorker::start(worker_config(&app, "rq", 2, 0)).await;
    let owner = app.signup("recorder@example.com", "Recorder").await;
    let token = owner.api_key.token.as_str();
    let sandbox = create_ok(&app, token, json!({})).await;
    // 1.5 MB of output, recorded: the team's 1 MiB quota is full once it is kept.
    let loud = exec(
        &app,
        token,
        &sandbox,
        json!({ "command": "head -c 1500000 /dev/zero | tr '\\0' x" }),
    )
    .await;
    assert_eq!(loud.status.as_u16(), 200, "{}", loud.body);
    wait_until(
        "the loud command's recording",
        Duration::from_secs(15),
        || async { !recordings_of(&app, token, &sandbox).await.is_empty() },
    )
    .await;
    let recording = recordings_of(&app, token, &sandbox).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Kept recordings are metered as storage, like snapshots.
    wait_until("the recording's storage usage", Duration::from_secs(20), || async {
        app.count(&format!(
            "SELECT count(*) FROM usage_events WHERE event_key LIKE 'storage-recording:{recording}:%'"
        ))
        .await
            > 0
    })
    .await;
    // Past the quota: a recorded command is refused, saying why and what to do; an
    // unrecorded one runs.
    let refused = exec(&app, token, &sandbox, json!({ "command": "echo again" })).await;
    refused.assert_error(409, "recording_quota_reached");
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1 MiB quota"),
        "{}",
        refused.body
    );
    let quiet = exec(
        &app,
        token,
        &sandbox,
        json!({ "command": "echo quiet", "record": false }),
    )
    .await;
    assert_eq!(quiet.status.as_u16(), 200, "{}", quiet.body);
    assert_eq!(quiet.body["stdout"], "quiet\n");
    // Deleting the recording frees the quota.
    let deleted = app
        .delete(&format!("/v1/recordings/{recording}"), token)
        .await;
    assert_eq!(deleted.status.as_u16(), 204, "{}", deleted.body);
    app.get(&format!("/v1/recordings/{recording}"), token)
        .await
        .assert_error(404, "not_found");
    let again = exec(&app, token, &sandbox, json!({ "command": "echo again" })).await;
    assert_eq!(again.status.as_u16(), 200, "{}", again.body);
    worker.clean_up().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_cannot_overwrite_another_recording() {
    let app = quota_app().await;
    let worker = TestWorker::start(worker_config(&app, "ow", 2, 0)).await;
    let credential = crate::testbed::worker_credential(&worker.config.worker_id);
    let owner = app.signup("overwrite@example.com", "Overwrite").await;
    let token = owner.api_key.token.as_str();
    let first = create_ok(&app, token, json!({})).await;
    let second = create_ok(&app, token, json!({})).await;
    let ran = exec(&app, token, &first, json!({ "command": "echo original" })).await;
    assert_eq!(ran.status.as_u16(), 200);
    wait_until("the first recording", Duration::from_secs(15), || async {
        !recordings_of(&app, token, &first).await.is_empty()
    })
    .await;
    let id = recordings_of(&app, token, &first).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = app.get_text(&format!("/v1/recordings/{id}"), token).await;
    assert!(before.contains("original"), "{before}");
    // The same worker hosts the second sandbox and sends "its" recording under the first's id.
    let meta = CommandRecording {
        sandbox: second.parse().unwrap(),
        kind: "exec".to_owned(),
        command: vec!["sh".to_owned(), "-c".to_owned(), "forged".to_owned()],
        shell_session: None,
        by: RecordFor::default(),
        duration_ms: 1,
        exit_code: Some(0),
    };
    let forged = "{\"version\":2,\"width\":80,\"height\":24}\n[0.0,\"o\",\"forged\"]\n";
    let status = app
        .internal_http
        .post(format!(
            "{}{}",
            app.internal,
            sandbase_api::internal::paths::recording_whole(&id)
        ))
        .header(NODE_TOKEN_HEADER, &credential)
        .header(RECORDING_HEADER, serde_json::to_string(&meta).unwrap())
        .body(forged)
        .send()
        .await
        .unwrap()
        .status();
    assert_ne!(status, StatusCode::NO_CONTENT);
    let after = app.get_text(&format!("/v1/recordings/{id}"), token).await;
    assert_eq!(after, before);
    worker.clean_up().await;
}

/// What an admin's session showed may be what a member must not see: a member reads only the
/// recordings members made; admins and owners read every one of the team's.
#[tokio::test(flavor = "multi_thread")]
async fn members_read_only_the_recordings_members_made() {
    let app = quota_app().await;
    let worker = TestWorker::start(worker_config(&app, "rr", 2, 0)).await;
    let owner = app.signup("rr-owner@example.com", "Readers").await;
    let owner_key = owner.api_key.token.as_str();
    app.signup("rr-member@example.com", "Own").await;
    app.add_member(owner_key, "rr-member@example.com", "member")
        .await;
    let member_session = app
        .login("rr-member@example.com", Some(owner.team.id))
        .await;
    let (_, member_key) = app
        .create_key(&member_session, json!({ "name": "m" }))
        .await;
    let sandbox = create_ok(&app, owner_key, json!({})).await;
    let secret = exec(
        &app,
        owner_key,
        &sandbox,
        json!({ "command": "echo owners-eyes-only" }),
    )
    .await;
    assert_eq!(secret.status.as_u16(), 200, "{}", secret.body);
    let mine = exec(
        &app,
        &member_key,
        &sandbox,
        json!({ "command": "echo member-work" }),
    )
    .await;
    assert_eq!(mine.status.as_u16(), 200, "{}", mine.body);
    wait_until("both recordings", Duration::from_secs(15), || async {
        recordings_of(&app, owner_key, &sandbox).await.len() == 2
    })
    .await;
    let all = recordings_of(&app, owner_key, &sandbox).await;
    let id_of = |text: &str| {
        all.iter()
            .find(|r| r["command"][2] == text)
            .unwrap_or_else(|| panic!("no recording of {text}: {all:?}"))["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (owners, members) = (id_of("echo owners-eyes-only"), id_of("echo member-work"));
    let seen = recordings_of(&app, &member_key, &sandbox).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["id"], members.as_str());
    app.get(&format!("/v1/recordings/{owners}"), &member_key)
        .await
        .assert_error(404, "not_found");
    let read = app
        .get_text(&format!("/v1/recordings/{members}"), &member_key)
        .await;
    assert!(read.contains("member-work"), "{read}");
    // A member's terminal keeps their keystrokes out of its recording unless asked (a
    // member's typing may be a password); an owner's keeps them.
    let cases = [
        (member_key.as_str(), json!({}), false),
        (owner_key, json!({}), true),
        (member_key.as_str(), json!({ "record_input": true }), true),
    ];
    assert_input_recorded(&app, owner_key, &sandbox, &cases).await;
    // The team may record its members' typing as well: admins only, and a session still
    // decides for itself.
    assert_eq!(
        app.get("/v1/team/settings", &member_key).await.body,
        json!({ "record_members_input": false })
    );
    let change = json!({ "record_members_input": true });
    app.patch("/v1/team/settings", &member_key, change.clone())
        .await
        .assert_error(403, "forbidden");
    let changed = app.patch("/v1/team/settings", owner_key, change).await;
    assert_eq!(changed.status.as_u16(), 200, "{}", changed.body);
    assert_eq!(changed.body["record_members_input"], true);
    let cases = [
        (member_key.as_str(), json!({}), true),
        (member_key.as_str(), json!({ "record_input": false }), false),
    ];
    assert_input_recorded(&app, owner_key, &sandbox, &cases).await;
    worker.clean_up().await;
}

/// Opens a recorded terminal with each (key, body) and checks whether its recording keeps
/// what is typed.
async fn assert_input_recorded(
    app: &TestApp,
    owner_key: &str,
    sandbox: &str,
    cases: &[(&str, serde_json::Value, bool)],
) {
    for (token, body, kept) in cases {
        let opened = app
            .post(&format!("/v1/sandboxes/{sandbox}/pty"), token, body.clone())
            .await;
        assert_eq!(opened.status.as_u16(), 201, "{}", opened.body);
        let session = opened.body["session_id"].clone();
        let all = app.get("/v1/recordings", owner_key).await.body["recordings"].clone();
        let recording = all
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["kind"] == "terminal" && r["session_id"] == session)
            .cloned()
            .unwrap_or_else(|| panic!("no recording of session {session}: {all}"));
        assert_eq!(recording["with_input"], *kept, "{recording}");
        let closed = app
            .delete(&format!("/v1/sandboxes/{sandbox}/pty/{session}"), token)
            .await;
        assert_eq!(closed.status.as_u16(), 204, "{}", closed.body);
    }
}
