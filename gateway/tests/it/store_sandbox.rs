//! The store from inside a sandbox: the official OpenAI SDK, run by python inside a sandbox
//! created with `store: true`, reaches the store with no key in the sandbox (its egress proxy
//! adds the sandbox's store credential), is billed to the sandbox's team and counted against
//! the sandbox's spend cap, and shows in its flow log; a sandbox without store access is
//! refused.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::Method;
use sandbase_egress::proxy::Resolver;
use sandbase_worker::network::{EgressConfig, PROXY_USER};
use sandbase_worker::service::TemplateSource;
use serde_json::{Value, json};

use crate::egress::{NODE_NETWORK, proxy_ports, proxy_program};
use crate::store::store_app_with;
use crate::testbed::{TestSandbox, TestWorker, configure_sandboxes, worker_config};

/// The cost of one stand-in chat call of `openai/gpt-test`: 800 input tokens at 2.50, 200
/// cached at 1.25 and 50 output at 10 credits per million, in micro-credits.
const CHAT_COST: i64 = 800 * 5 / 2 + 200 * 5 / 4 + 50 * 10;

/// The packages `import openai` loads from the test venv, as a tar archive (the base
/// template runs the same Debian python).
fn openai_packages() -> Vec<u8> {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let listed = std::process::Command::new(&python)
        .args([
            "-c",
            "import os, sys, openai\n\
             openai.OpenAI(api_key='-', base_url='http://127.0.0.1:9').close()\n\
             site = os.path.dirname(os.path.dirname(openai.__file__))\n\
             tops = {os.path.relpath(m.__file__, site).split(os.sep)[0] for m in list(sys.modules.values())\n\
                     if getattr(m, '__file__', None) and m.__file__.startswith(site + os.sep)}\n\
             tops |= {t for t in ('distro', 'jiter', 'certifi', 'httpcore2', 'h11', 'sniffio') if os.path.exists(os.path.join(site, t))}\n\
             tops -= {'_distutils_hack'}\n\
             from importlib import metadata\n\
             owners = metadata.packages_distributions()\n\
             for top in list(tops):\n\
             \x20   for dist in owners.get(top.removesuffix('.py'), []):\n\
             \x20       tops.add(os.path.basename(str(metadata.distribution(dist)._path)))\n\
             print(site); print('\\n'.join(sorted(tops)))",
        ])
        .output()
        .expect("the test venv's python (scripts/setup --test makes it)");
    assert!(listed.status.success(), "{listed:?}");
    let listed = String::from_utf8(listed.stdout).unwrap();
    let mut lines = listed.lines();
    let site = std::path::PathBuf::from(lines.next().unwrap());
    let mut archive = tar::Builder::new(Vec::new());
    archive.follow_symlinks(true);
    for top in lines {
        let path = site.join(top);
        if path.is_dir() {
            archive.append_dir_all(top, &path).unwrap();
        } else {
            archive.append_path_with_name(&path, top).unwrap();
        }
    }
    archive.into_inner().unwrap()
}

/// Python inside the sandbox: a plain and a streamed chat call with the unmodified SDK,
/// configured by nothing but the sandbox's environment.
const SDK_CALLS: &str = r#"
import json, openai
client = openai.OpenAI()
whole = client.chat.completions.create(
    model="openai/gpt-test", messages=[{"role": "user", "content": "hi"}])
streamed = client.chat.completions.create(
    model="openai/gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True)
text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
print(json.dumps({"whole": whole.choices[0].message.content,
                  "usage": whole.usage.prompt_tokens, "streamed": text}))
"#;

/// What the sandbox's SDK gets when the store refuses it.
const SDK_REFUSED: &str = r#"
import json, openai
try:
    openai.OpenAI().chat.completions.create(
        model="openai/gpt-test", messages=[{"role": "user", "content": "hi"}])
    print(json.dumps({"status": 200}))
except openai.APIStatusError as error:
    print(json.dumps({"status": error.status_code, "code": error.body.get("code")}))
"#;

async fn python(sandbox: &TestSandbox<'_>, script: &str) -> Value {
    let (status, _) = sandbox
        .put_file("/work/call.py", script.as_bytes().to_vec())
        .await;
    assert!(status.is_success(), "{status}");
    let answer = sandbox
        .sh("PYTHONPATH=/work/py PYTHONDONTWRITEBYTECODE=1 python3 /work/call.py")
        .await;
    let stdout = answer["stdout"].as_str().unwrap_or_default();
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("the SDK's output: {answer}"))
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_with_store_access_calls_the_sdk_with_no_key_inside() {
    let _network = NODE_NETWORK.lock().await;
    let (app, _seen) = store_app_with(configure_sandboxes).await;
    let mut config = worker_config(&app, "w", 4, 0);
    let tarball = std::env::var("SANDBASE_BASE_TARBALL")
        .expect("SANDBASE_BASE_TARBALL: the base root file system (scripts/setup builds it)");
    config
        .templates
        .push(("base".to_owned(), TemplateSource::Tarball(tarball.into())));
    config.node.egress = Some(EgressConfig {
        pool: "10.216.0.0".parse().unwrap(),
        proxy_port: proxy_ports(),
        resolver: Resolver::Fixed(HashMap::new()),
        node_addresses: Vec::new(),
        denied_networks: Vec::new(),
        max_connections: 16,
        extra_ca: None,
        proxy_program: proxy_program(),
        proxy_user: Some(PROXY_USER),
        restart_delay: Duration::from_secs(1),
    });
    let worker = TestWorker::start(config).await;
    let alice = app
        .signup(&crate::helpers::email("alice"), "Alice's team")
        .await;
    let token = alice.api_key.token.clone();
    let size = json!({ "memory_mb": 512, "disk_mb": 512 });
    let sandbox = TestSandbox::create(
        &app,
        &token,
        json!({ "template": "base", "store": true, "max_credits": "1", "resources": size }),
    )
    .await;
    assert_eq!(sandbox.get("").await.body["store"], true);
    let (status, body, _) = sandbox
        .raw(
            Method::PUT,
            "/archive?path=/work/py",
            Some(openai_packages()),
        )
        .await;
    assert!(status.is_success(), "{}", String::from_utf8_lossy(&body));

    // The SDK works unmodified: content as the stand-in's, usage as it sent.
    let answer = python(&sandbox, SDK_CALLS).await;
    assert_eq!(answer["whole"], "Hello from the stand-in", "{answer}");
    assert_eq!(answer["streamed"], "Hello from the stand-in", "{answer}");
    assert_eq!(answer["usage"], 1000, "{answer}");

    // Billed to the team, as the sandbox, to the micro-credit, and counted on its cap.
    let sandbox_id: uuid::Uuid = sandbox.id.parse().unwrap();
    let sql = format!(
        "SELECT count(*) FROM store_requests WHERE sandbox_id = '{sandbox_id}' AND cost_micro = {CHAT_COST}"
    );
    for _ in 0..100 {
        if app.count(&sql).await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.count(&sql).await, 2);
    let spent = app
        .count(&format!(
            "SELECT spent_micro FROM sandboxes WHERE id = '{sandbox_id}'"
        ))
        .await;
    assert!(spent >= 2 * CHAT_COST, "spent {spent}");
    let debited = app
        .count(&format!(
            "SELECT count(*) FROM ledger_transactions WHERE team_id = '{}' \
             AND details->>'sandbox' = '{sandbox_id}' AND details->>'kind' = 'model'",
            alice.team.id
        ))
        .await;
    assert_eq!(debited, 2);

    // The flow log shows the store connections, the credential named, never its value.
    let flows = sandbox.get("/egress").await.body;
    let store_flows: Vec<&Value> = flows["flows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|flow| flow["host"] == sandbase_egress::STORE_HOST)
        .collect();
    assert!(!store_flows.is_empty(), "{flows}");
    assert!(
        store_flows.iter().all(|flow| flow["decision"] == "injected"
            && flow["credentials"] == json!(["sandbase-store"])),
        "{flows}"
    );

    // No key inside: not in the environment, the processes, or the files it can read.
    let environment = sandbox.sh("env").await["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(environment.contains("OPENAI_API_KEY=sandbase-store-placeholder"));
    assert!(environment.contains("OPENAI_BASE_URL=http://store.sandbase.internal/openai/v1"));
    // The patterns are written so that the search's own command line does not match them;
    // a planted credential-like file is the search's control.
    let token_pattern = format!("{}[{}]{}", &token[..4], &token[4..5], &token[5..]);
    let search = format!(
        "printf 'sb%s_%s' s control > /tmp/planted; \
         grep -rsl -e 'sbs[_]' -e '{token_pattern}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline \
         /etc /tmp /root /home /work --exclude-dir=py; echo end; rm /tmp/planted"
    );
    let found = sandbox.sh(&search).await;
    assert_eq!(found["stdout"], "/tmp/planted\nend\n", "found: {found}");

    // The sandbox's spend cap holds for its store calls: a sandbox whose cap cannot cover a
    // call's worst case is refused in the SDK's own error.
    let capped = TestSandbox::create(
        &app,
        &token,
        json!({ "template": "base", "store": true, "max_credits": "0.001", "resources": size }),
    )
    .await;
    let (status, _, _) = capped
        .raw(
            Method::PUT,
            "/archive?path=/work/py",
            Some(openai_packages()),
        )
        .await;
    assert!(status.is_success());
    let refused = python(&capped, SDK_REFUSED).await;
    assert_eq!(
        refused,
        json!({ "status": 402, "code": "spend_cap_reached" })
    );

    // A sandbox with egress but without store access is refused at the proxy.
    let other = TestSandbox::create(
        &app,
        &token,
        json!({ "template": "base", "egress": { "allow": ["example.org"] } }),
    )
    .await;
    let answer = other
        .sh("curl -s -w ' %{http_code}' http://store.sandbase.internal/openai/v1/models")
        .await;
    let stdout = answer["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout.ends_with(" 403") && stdout.contains("store access"),
        "{answer}"
    );

    // Runs get store access like sandboxes.
    runs_reach_the_store(&app, &token).await;

    for id in [&sandbox.id, &capped.id, &other.id] {
        app.delete(&format!("/v1/sandboxes/{id}"), &token).await;
    }
    worker.clean_up_with(&["base"]).await;
}

async fn runs_reach_the_store(app: &crate::helpers::TestApp, token: &str) {
    let queued = app
        .post(
            "/v1/runs",
            token,
            json!({ "template": "base", "store": true,
                    "command": "curl -sS --max-time 10 \"$OPENAI_BASE_URL/models\"" }),
        )
        .await;
    assert_eq!(queued.status.as_u16(), 202, "{}", queued.body);
    assert_eq!(queued.body["store"], true);
    let run_id = queued.body["id"].as_str().unwrap().to_owned();
    let run = crate::testbed::finished_run(app, token, &run_id).await;
    assert_eq!(run["exit_code"], 0, "{run}");
    let listed: Value = serde_json::from_str(run["stdout"].as_str().unwrap()).unwrap();
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|model| model["id"] == "openai/gpt-test"),
        "{listed}"
    );
}
