//! The served OpenAPI document is valid and lists exactly the routes the router serves.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::Value;

use crate::helpers::{email, spawn_app};

/// Every route the gateway serves. A route added to the router appears in the document
/// by construction (both come from one `OpenApiRouter`); this list makes the test notice.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/v1/openapi.json"),
    ("POST", "/v1/auth/signup"),
    ("POST", "/v1/auth/login"),
    ("POST", "/v1/auth/switch"),
    ("POST", "/v1/auth/verify"),
    ("GET", "/v1/me"),
    ("GET", "/v1/api-keys"),
    ("POST", "/v1/api-keys"),
    ("GET", "/v1/api-keys/{id}"),
    ("DELETE", "/v1/api-keys/{id}"),
    ("GET", "/v1/team/members"),
    ("POST", "/v1/team/members"),
    ("GET", "/v1/team/members/{user_id}"),
    ("PATCH", "/v1/team/members/{user_id}"),
    ("DELETE", "/v1/team/members/{user_id}"),
    ("GET", "/v1/team/settings"),
    ("PATCH", "/v1/team/settings"),
    ("GET", "/v1/team/invitations"),
    ("GET", "/v1/invitations"),
    ("POST", "/v1/invitations/{id}/accept"),
    ("GET", "/v1/audit"),
    ("GET", "/v1/audit/{id}"),
    ("POST", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes/{id}"),
    ("DELETE", "/v1/sandboxes/{id}"),
    ("POST", "/v1/sandboxes/{id}/timeout"),
    ("POST", "/v1/sandboxes/{id}/exec"),
    ("GET", "/v1/sandboxes/{id}/processes"),
    ("GET", "/v1/sandboxes/{id}/processes/{pid}"),
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/stdin"),
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/signal"),
    ("GET", "/v1/sandboxes/{id}/execs/{exec_id}"),
    ("POST", "/v1/sandboxes/{id}/execs/{exec_id}/cancel"),
    ("POST", "/v1/sandboxes/{id}/code"),
    ("POST", "/v1/sandboxes/{id}/code/contexts"),
    ("GET", "/v1/sandboxes/{id}/code/contexts"),
    ("DELETE", "/v1/sandboxes/{id}/code/contexts/{context}"),
    (
        "POST",
        "/v1/sandboxes/{id}/code/contexts/{context}/interrupt",
    ),
    ("GET", "/v1/sandboxes/{id}/files"),
    ("PUT", "/v1/sandboxes/{id}/files"),
    ("DELETE", "/v1/sandboxes/{id}/files"),
    ("GET", "/v1/sandboxes/{id}/archive"),
    ("PUT", "/v1/sandboxes/{id}/archive"),
    ("GET", "/v1/templates"),
    ("GET", "/v1/billing/balance"),
    ("GET", "/v1/billing/ledger"),
    ("POST", "/v1/billing/checkout"),
    ("GET", "/v1/usage"),
    ("POST", "/v1/billing/stripe/webhook"),
    ("POST", "/v1/admin/teams/{id}/grants"),
    ("GET", "/v1/secrets"),
    ("POST", "/v1/secrets"),
    ("PUT", "/v1/secrets/{name}"),
    ("DELETE", "/v1/secrets/{name}"),
    ("GET", "/v1/sandboxes/{id}/egress-policy"),
    ("PUT", "/v1/sandboxes/{id}/egress-policy"),
    ("GET", "/v1/sandboxes/{id}/egress"),
    ("GET", "/v1/egress-policy"),
    ("PUT", "/v1/egress-policy"),
    ("DELETE", "/v1/egress-policy"),
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs"),
    ("GET", "/v1/runs/{id}"),
    ("GET", "/v1/runs/{id}/artifacts"),
    ("POST", "/v1/agent-runs"),
    ("GET", "/v1/agent-runs"),
    ("GET", "/v1/agent-runs/{id}"),
    ("DELETE", "/v1/agent-runs/{id}"),
    ("GET", "/v1/agent-runs/{id}/events"),
    ("GET", "/v1/agent-runs/{id}/steps"),
    ("GET", "/v1/agent-runs/{id}/turns"),
    ("POST", "/v1/agent-runs/{id}/inputs"),
    ("POST", "/v1/agent-runs/{id}/cancel"),
    ("POST", "/v1/sandboxes/{id}/pause"),
    ("POST", "/v1/sandboxes/{id}/resume"),
    ("POST", "/v1/sandboxes/{id}/previews"),
    ("GET", "/v1/sandboxes/{id}/previews"),
    ("DELETE", "/v1/sandboxes/{id}/previews/{port}"),
    ("POST", "/v1/sandboxes/{id}/snapshots"),
    ("GET", "/v1/snapshots"),
    ("GET", "/v1/snapshots/{id}"),
    ("DELETE", "/v1/snapshots/{id}"),
    ("POST", "/v1/sandboxes/{id}/pty"),
    ("GET", "/v1/sandboxes/{id}/pty"),
    ("GET", "/v1/sandboxes/{id}/pty/{sid}"),
    ("DELETE", "/v1/sandboxes/{id}/pty/{sid}"),
    ("POST", "/v1/sandboxes/{id}/pty/{sid}/input"),
    ("POST", "/v1/sandboxes/{id}/pty/{sid}/resize"),
    ("GET", "/v1/sandboxes/{id}/pty/{sid}/output"),
    ("POST", "/v1/sandboxes/{id}/pty/{sid}/ticket"),
    ("GET", "/v1/sandboxes/{id}/pty/{sid}/attach"),
    ("GET", "/v1/sandboxes/{id}/pty/{sid}/recording"),
    ("GET", "/v1/recordings"),
    ("GET", "/v1/recordings/{id}"),
    ("DELETE", "/v1/recordings/{id}"),
    ("GET", "/v1/store/models"),
    ("GET", "/v1/store/apis"),
    ("GET", "/v1/store/requests"),
    ("GET", "/v1/store/requests/{id}"),
];

#[tokio::test]
async fn the_document_lists_every_route_and_every_listed_route_is_served() {
    let app = spawn_app().await;
    let owner = app.signup(&email("spec"), "Spec").await;
    let document = app
        .request(Method::GET, "/v1/openapi.json", None, None)
        .await;
    assert_eq!(document.status, 200);
    let document = document.body;
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3.1."),
        "{}",
        document["openapi"]
    );

    let mut listed = BTreeSet::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "put", "post", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                listed.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(method, path)| (method.to_string(), path.to_string()))
        .collect();
    assert_eq!(listed, expected);

    // Each listed route is really routed: whatever it answers, it is not the router's
    // "no such route" or "no such method".
    for (method, path) in &listed {
        let concrete = path
            .replace("{id}", "00000000-0000-0000-0000-000000000000")
            .replace("{user_id}", "00000000-0000-0000-0000-000000000000")
            .replace("{pid}", "1")
            .replace("{sid}", "1");
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let answer = app
            .request(method.clone(), &concrete, Some(&owner.session.token), None)
            .await;
        assert!(
            !matches!(answer.code(), "route_not_found" | "method_not_allowed"),
            "{method} {path} is in the document but not routed: {}",
            answer.body
        );
    }

    // Every operation has a unique id and responses; every $ref resolves.
    let mut operation_ids = BTreeSet::new();
    for item in document["paths"].as_object().unwrap().values() {
        for operation in item.as_object().unwrap().values() {
            let id = operation["operationId"]
                .as_str()
                .expect("operationId")
                .to_owned();
            assert!(
                operation_ids.insert(id.clone()),
                "duplicate operationId {id}"
            );
            assert!(
                operation["responses"]
                    .as_object()
                    .is_some_and(|r| !r.is_empty()),
                "{id} has no responses"
            );
        }
    }
    check_refs(&document, &document);
}

fn check_refs(root: &Value, node: &Value) {
    match node {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get("$ref") {
                let pointer = reference.strip_prefix('#').expect("local $ref");
                assert!(root.pointer(pointer).is_some(), "dangling $ref {reference}");
            }
            map.values().for_each(|value| check_refs(root, value));
        }
        Value::Array(items) => items.iter().for_each(|value| check_refs(root, value)),
        _ => {}
    }
}

/// Validated by an independent implementation of the OpenAPI 3.1 schema
/// (`openapi-spec-validator`, which `scripts/test` installs into `.venv`).
#[tokio::test]
async fn the_document_passes_an_openapi_3_1_validator() {
    let validator = std::env::var("SANDBASE_OPENAPI_VALIDATOR").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../.venv/bin/openapi-spec-validator"
        )
        .to_owned()
    });
    assert!(
        std::path::Path::new(&validator).exists(),
        "{validator} is missing: run the tests with scripts/test, which installs it"
    );
    let app = spawn_app().await;
    let document = app
        .request(Method::GET, "/v1/openapi.json", None, None)
        .await
        .body;
    let file = std::env::temp_dir().join(format!("sandbase-openapi-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&file, serde_json::to_vec_pretty(&document).unwrap()).unwrap();
    let output = std::process::Command::new(&validator)
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_file(&file).ok();
    assert!(
        output.status.success(),
        "the OpenAPI document is invalid:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
