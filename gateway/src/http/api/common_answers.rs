//! The answers every route can give besides its own, written into the OpenAPI document so
//! that it lists every status a route can answer: the layers in front of the handlers
//! refuse before a handler runs (the address's or the key's rate → 429, a missing or bad
//! credential → 401, a body over the limit → 413, a JSON body of another type → 415, a
//! body or query that does not parse → 400 or 422), any route can find PostgreSQL or
//! Redis away (503), a route reaching a sandbox's worker finds the sandbox stopped or
//! paused (409), and one on its files finds the file system refusing (403, 409, 507). Each
//! is added where the route does not document it itself.

use serde_json::{Value, json};

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch"];

/// Adds the common answers to every operation of `document`.
pub fn document(document: &mut Value) {
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        for method in METHODS {
            if let Some(operation) = item.get_mut(*method) {
                add(path, operation);
            }
        }
    }
}

/// The data plane under a sandbox: routes that reach the sandbox's worker, and so answer 409
/// when the sandbox is not running or is paused.
const DATA_PLANE: &[&str] = &[
    "/archive",
    "/code",
    "/egress",
    "/execs",
    "/files",
    "/processes",
    "/pty",
];

fn reaches_the_worker(path: &str) -> bool {
    path.strip_prefix("/v1/sandboxes/{id}")
        .is_some_and(|rest| DATA_PLANE.iter().any(|prefix| rest.starts_with(prefix)))
        && !path.ends_with("/recording")
}

/// Routes on the sandbox's files, which its file system can refuse.
fn touches_files(path: &str) -> bool {
    path.strip_prefix("/v1/sandboxes/{id}")
        .is_some_and(|rest| rest == "/files" || rest == "/archive")
}

fn add(path: &str, operation: &mut Value) {
    let secured = operation
        .get("security")
        .and_then(Value::as_array)
        .is_some_and(|schemes| !schemes.is_empty());
    let json_body = operation
        .pointer("/requestBody/content/application~1json")
        .is_some();
    let any_body = operation.get("requestBody").is_some();
    let has_input = any_body
        || operation
            .get("parameters")
            .and_then(Value::as_array)
            .is_some_and(|parameters| !parameters.is_empty());
    let mut answers: Vec<(&str, &str)> = vec![
        (
            "429",
            "Too many requests from this address or key (`rate_limited`, with `Retry-After`)",
        ),
        (
            "503",
            "A backing service is unavailable (`unavailable`, `busy`), retry later",
        ),
    ];
    if secured {
        answers.push(("401", "Missing, malformed, unknown, revoked or expired credentials (`unauthenticated`, `invalid_api_key`, `session_expired`, …)"));
    }
    if any_body {
        answers.push(("413", "Body larger than the limit (`payload_too_large`)"));
    }
    if json_body {
        answers.push(("415", "Not `application/json` (`unsupported_media_type`)"));
        answers.push(("400", "Body is not valid JSON (`invalid_json`)"));
    }
    if has_input {
        answers.push(("422", "A field or parameter is invalid (`invalid_request`)"));
    }
    if touches_files(path) {
        answers.push(("409", "The sandbox is not running (`sandbox_not_running`) or is paused (`sandbox_paused`), or the path is not what the operation needs (`already_exists`, `directory_not_empty`, `is_a_directory`, `not_a_directory`)"));
        answers.push((
            "403",
            "The sandbox's file system refuses it (`permission_denied`)",
        ));
        answers.push(("507", "The sandbox's disk is full (`disk_full`)"));
    } else if reaches_the_worker(path) {
        answers.push((
            "409",
            "The sandbox is not running (`sandbox_not_running`) or is paused (`sandbox_paused`)",
        ));
    }
    let Some(responses) = operation
        .as_object_mut()
        .map(|operation| operation.entry("responses").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (status, description) in answers {
        responses.entry(status).or_insert_with(|| {
            json!({
                "description": description,
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } }
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_gets_the_answers_of_its_layers_and_keeps_its_own() {
        let mut doc = json!({ "paths": {
            "/v1/things": {
                "post": {
                    "security": [{ "bearer": [] }],
                    "requestBody": { "content": { "application/json": {} } },
                    "responses": { "422": { "description": "own" } }
                },
                "get": { "responses": { "200": { "description": "OK" } } }
            }
        } });
        document(&mut doc);
        let post = &doc["paths"]["/v1/things"]["post"]["responses"];
        for status in ["400", "401", "413", "415", "429", "503"] {
            assert_eq!(
                post[status]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/ErrorBody",
                "{status}"
            );
        }
        assert_eq!(post["422"]["description"], "own");
        let get = &doc["paths"]["/v1/things"]["get"]["responses"];
        assert!(get.get("401").is_none() && get.get("415").is_none() && get.get("422").is_none());
        assert!(get.get("429").is_some() && get.get("200").is_some());
        assert!(get.get("409").is_none());
    }

    #[test]
    fn the_data_plane_documents_a_sandbox_that_is_not_running() {
        let mut doc = json!({ "paths": {
            "/v1/sandboxes/{id}/files": { "get": { "responses": {} } },
            "/v1/sandboxes/{id}/pty/{sid}/attach": { "get": { "responses": {} } },
            "/v1/sandboxes/{id}/pty/{sid}/recording": { "get": { "responses": {} } },
            "/v1/sandboxes/{id}/previews": { "get": { "responses": {} } }
        } });
        document(&mut doc);
        let files = &doc["paths"]["/v1/sandboxes/{id}/files"]["get"]["responses"];
        assert!(files.get("403").is_some() && files.get("507").is_some());
        let has = |path: &str| doc["paths"][path]["get"]["responses"].get("409").is_some();
        assert!(has("/v1/sandboxes/{id}/files") && has("/v1/sandboxes/{id}/pty/{sid}/attach"));
        assert!(
            !has("/v1/sandboxes/{id}/pty/{sid}/recording") && !has("/v1/sandboxes/{id}/previews")
        );
    }
}
