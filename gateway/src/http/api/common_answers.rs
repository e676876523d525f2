//! The answers every route can give besides its own, written into the OpenAPI document so
//! that it lists every status a route can answer: the layers in front of the handlers
//! refuse before a handler runs (the address's or the key's rate → 429, a missing or bad
//! credential → 401, a body over the limit → 413, a JSON body of another type → 415, a
//! body or query that does not parse → 400 or 422), and any route can find PostgreSQL or
//! Redis away (503). Each is added where the route does not document it itself.

use serde_json::{Value, json};

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch"];

/// Adds the common answers to every operation of `document`.
pub fn document(document: &mut Value) {
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut() {
        for method in METHODS {
            if let Some(operation) = item.get_mut(*method) {
                add(operation);
            }
        }
    }
}

fn add(operation: &mut Value) {
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
    }
}
