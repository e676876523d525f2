//! Volumes: a sandbox mounts only the operator's volumes it asks for, read-only unless the
//! volume is writable and the mount asks.

use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use sandbase_worker::node::Volume;

use crate::testbed::{TestWorker, create, create_ok, sandbox_app, sh, worker_config};

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
/// Volumes: only what a sandbox asks for, read-only unless the volume is writable; nothing
/// for sandboxes that did not ask; unknown volumes and reserved paths refused.
#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_mount_only_the_volumes_they_ask_for() {
    let app = sandbox_app().await;
    let mut config = worker_config(&app, "w", 4, 1);
    let shared = std::env::temp_dir().join(format!("sandbase-volume-{}", Uuid::new_v4().simple()));
    let scratch = std::env::temp_dir().join(format!("sandbase-volume-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(shared.join("readme.txt"), "shared data\n").unwrap();
    // The sandbox user is host uid id_base + 1000: the operator gives it the writable volume.
    let user = config.worker.id_base + 1000;
    std::os::unix::fs::chown(&scratch, Some(user), Some(user)).unwrap();
    let alice = app.signup("alice@example.com", "Alice").await;
    let mallory = app.signup("mallory@example.com", "Mallory").await;
    let token = alice.api_key.token.as_str();
    // Writable for Alice's team only.
    config.node.volumes = [
        (
            "shared".to_owned(),
            Volume {
                path: shared.clone(),
                writers: Vec::new(),
            },
        ),
        (
            "scratch".to_owned(),
            Volume {
                path: scratch.clone(),
                writers: vec![alice.team.id],
            },
        ),
    ]
    .into();
    let worker = TestWorker::start(config).await;

    let answer = create(
        &app,
        token,
        json!({ "mounts": [
            { "volume": "shared", "path": "/data" },
            { "volume": "scratch", "path": "/work/scratch", "read_only": false },
        ] }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(answer.body["mounts"][0]["read_only"], true);
    let id = answer.body["id"].as_str().unwrap().to_owned();
    let result = sh(
        &app,
        token,
        &id,
        "cat /data/readme.txt; echo new > /work/scratch/out.txt && echo wrote",
    )
    .await;
    assert_eq!(result["stdout"], "shared data\nwrote\n", "{result}");
    assert_eq!(
        std::fs::read_to_string(scratch.join("out.txt")).unwrap(),
        "new\n"
    );
    for command in [
        "echo x > /data/readme.txt",
        "rm /data/readme.txt",
        "touch /data/new",
    ] {
        let result = sh(&app, token, &id, command).await;
        assert_ne!(result["exit_code"], 0, "`{command}` succeeded");
    }
    assert_eq!(
        std::fs::read_to_string(shared.join("readme.txt")).unwrap(),
        "shared data\n"
    );

    // Another team may not write the volume (the attack: its files are Alice's team's) ...
    app.post(
        "/v1/sandboxes",
        &mallory.api_key.token,
        json!({ "mounts": [{ "volume": "scratch", "path": "/work/scratch", "read_only": false }] }),
    )
    .await
    .assert_error(422, "volume_not_found");
    // ... nor get it past the gateway: the worker refuses it too.
    let refused = worker
        .running()
        .node()
        .create(sandbase_api::internal::CreateSandbox {
            id: Uuid::new_v4(),
            team_id: Some(mallory.team.id),
            template: "busybox".to_owned(),
            resources: sandbase_api::sandboxes::Resources {
                cpu_millis: 500,
                memory_mb: 64,
                disk_mb: 16,
                pids: 32,
            },
            isolation: Default::default(),
            auto_pause_after_idle_secs: None,
            store_token: None,
            env: Default::default(),
            cwd: "/work".to_owned(),
            mounts: vec![sandbase_api::sandboxes::Mount {
                volume: "scratch".to_owned(),
                path: "/work/scratch".to_owned(),
                read_only: false,
            }],
            egress: None,
            credentials: Vec::new(),
        })
        .await;
    assert!(
        matches!(refused, Err(sandbase_worker::node::NodeError::Invalid(_))),
        "{refused:?}"
    );
    // Read-only, it may.
    let reader = create_ok(
        &app,
        &mallory.api_key.token,
        json!({ "mounts": [{ "volume": "scratch", "path": "/work/scratch" }] }),
    )
    .await;
    let result = sh(
        &app,
        &mallory.api_key.token,
        &reader,
        "cat /work/scratch/out.txt; echo x > /work/scratch/out.txt",
    )
    .await;
    assert_eq!(result["stdout"], "new\n", "{result}");
    assert_ne!(result["exit_code"], 0, "{result}");
    assert_eq!(
        std::fs::read_to_string(scratch.join("out.txt")).unwrap(),
        "new\n"
    );

    // A sandbox that asked for nothing sees nothing of them.
    let plain = create_ok(&app, token, json!({})).await;
    let result = sh(
        &app,
        token,
        &plain,
        "ls /data /work/scratch 2>&1; cat /data/readme.txt",
    )
    .await;
    assert!(
        !result["stdout"].as_str().unwrap().contains("shared data"),
        "{result}"
    );

    // Refused: unknown volume, writable mount of a read-only volume, reserved paths.
    app.post(
        "/v1/sandboxes",
        token,
        json!({ "mounts": [{ "volume": "nope", "path": "/data" }] }),
    )
    .await
    .assert_error(422, "volume_not_found");
    app.post(
        "/v1/sandboxes",
        token,
        json!({ "mounts": [{ "volume": "shared", "path": "/data", "read_only": false }] }),
    )
    .await
    .assert_error(422, "volume_not_found");
    for path in [
        "/etc",
        "/proc/x",
        "/.sandbase/run",
        "/work",
        "/",
        "relative",
        "/a/../etc",
    ] {
        let answer = app
            .post(
                "/v1/sandboxes",
                token,
                json!({ "mounts": [{ "volume": "shared", "path": path }] }),
            )
            .await;
        assert_eq!(answer.status.as_u16(), 422, "{path}: {}", answer.body);
    }
    assert_eq!(
        app.count("SELECT count(*) FROM sandboxes WHERE state = 'running'")
            .await,
        3
    );
    worker.clean_up().await;
    std::fs::remove_dir_all(&shared).unwrap();
    std::fs::remove_dir_all(&scratch).unwrap();
}
