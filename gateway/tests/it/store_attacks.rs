//! Attacks on the store's forwarding: a paid API's path climbing out of its base however it is
//! encoded, an upstream's redirect carrying the operator's credential elsewhere, a key's
//! model allow-list skipped by one of the store's surfaces, and a paid call left unbilled by
//! a client that hangs up before its answer.

use serde_json::{Value, json};

use crate::store::{available, call, chat, store_app};

#[tokio::test]
async fn a_paid_apis_path_stays_under_its_base_and_redirects_are_not_followed() {
    let (app, seen) = store_app().await;
    let team = app.signup("escape@example.com", "Escape").await;
    let key = team.api_key.token.as_str();
    let raw_get = |path: &str| {
        // Sent as written: no client-side normalisation of the path.
        let url = format!("{}/store/apis/search/{path}", app.address);
        let url = reqwest::Url::parse(&url).unwrap();
        app.http.get(url).bearer_auth(key).send()
    };
    for attack in [
        "%252e%252e/admin",
        "%252e%252e/%252e%252e/admin",
        "..%5Cadmin",
        "..%5C..%5Cadmin",
        ".%09./admin",
        ".%09./.%09./admin",
        "x%2F..%2F..%2Fadmin",
    ] {
        let answer = raw_get(attack).await.unwrap();
        let status = answer.status();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 422, "{attack}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{attack}: {body}");
    }
    // A redirect is passed back, not followed with the operator's credential.
    let redirected = raw_get("redirect").await.unwrap();
    assert_eq!(redirected.status(), 302);
    // Nothing outside the API's base was ever asked for, and the redirect's target never.
    let paths: Vec<String> = seen
        .all()
        .await
        .iter()
        .map(|request| request["path"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        paths.iter().all(|path| path.starts_with("/api/")),
        "the upstream saw {paths:?}"
    );
    assert!(
        paths.iter().any(|path| path == "/api/redirect"),
        "{paths:?}"
    );
    // And the API still works.
    let answer = raw_get("search?q=ok").await.unwrap();
    assert_eq!(answer.status(), 200);
}

#[tokio::test]
async fn a_keys_allowed_models_hold_on_every_store_surface() {
    let (app, _) = store_app().await;
    let team = app.signup("surfaces@example.com", "Surfaces").await;
    let owner = team.api_key.token.as_str();
    let created = app
        .post(
            "/v1/api-keys",
            owner,
            json!({ "name": "openai only", "allowed_models": ["openai/*"] }),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let restricted = created.body["token"].as_str().unwrap().to_owned();
    // Counting tokens for a model the key may not use is refused like calling it.
    let counted = call(
        &app,
        "/anthropic/v1/messages/count_tokens",
        &restricted,
        json!({ "model": "anthropic/claude-test", "messages": [{ "role": "user", "content": "hi" }] }),
    )
    .await;
    assert_eq!(counted.status(), 403);
    let body: Value = counted.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_allowed", "{body}");
    // A paid API is not a model: a key restricted to models reaches no API…
    let api = app
        .http
        .get(format!("{}/store/apis/search/search?q=x", app.address))
        .bearer_auth(&restricted)
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), 403);
    let body: Value = api.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_allowed", "{body}");
    // …unless its list names it (`api:NAME`), and the owner's key reaches everything.
    let created = app
        .post(
            "/v1/api-keys",
            owner,
            json!({ "name": "search", "allowed_models": ["openai/*", "api:search"] }),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let with_api = created.body["token"].as_str().unwrap().to_owned();
    let api = app
        .http
        .get(format!("{}/store/apis/search/search?q=x", app.address))
        .bearer_auth(&with_api)
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), 200);
    let counted = call(
        &app,
        "/anthropic/v1/messages/count_tokens",
        owner,
        json!({ "model": "anthropic/claude-test", "messages": [{ "role": "user", "content": "hi" }] }),
    )
    .await;
    assert_eq!(counted.status(), 200);
    let allowed = call(
        &app,
        "/openai/v1/chat/completions",
        &restricted,
        chat("openai/gpt-test", "hi", false),
    )
    .await;
    assert_eq!(allowed.status(), 200);
}

#[tokio::test]
async fn a_paid_api_call_whose_client_leaves_is_still_billed() {
    let (app, _) = store_app().await;
    let team = app.signup("leaver@example.com", "Leaver").await;
    let key = team.api_key.token.as_str();
    let before = available(&app, key).await;
    let count = || app.count("SELECT count(*) FROM store_requests WHERE kind = 'api'");
    let calls = count().await;
    // The client gives up after 200 ms; the API answers after 1.5 s and charges for it.
    let left = app
        .http
        .get(format!("{}/store/apis/search/slow?q=x", app.address))
        .bearer_auth(key)
        .timeout(std::time::Duration::from_millis(200))
        .send()
        .await;
    assert!(left.is_err(), "the client was meant to leave");
    crate::testbed::wait_until(
        "the call to be settled",
        std::time::Duration::from_secs(10),
        || async { count().await > calls },
    )
    .await;
    crate::testbed::wait_until("the debit", std::time::Duration::from_secs(10), || async {
        available(&app, key).await < before
    })
    .await;
}

/// What a request can make the provider charge is priced or refused: a priority tier or the
/// provider's own tools are refused before anything is reserved, and an image (tokens its
/// bytes do not show) reserves the whole context window, so a small cap refuses it.
#[tokio::test]
async fn what_the_provider_would_charge_is_priced_or_refused() {
    let (app, seen) = store_app().await;
    let team = app.signup("pricing@example.com", "Pricing").await;
    let owner = team.api_key.token.as_str();
    let (_, capped) = app
        .create_key(owner, json!({ "name": "small", "max_credits": "0.05" }))
        .await;
    let before = seen.all().await.len();
    for (field, value) in [
        ("service_tier", json!("priority")),
        ("web_search_options", json!({})),
        ("audio", json!({ "voice": "alloy", "format": "wav" })),
        ("something_new", json!(true)),
    ] {
        let mut body = chat("openai/gpt-test", "hi", false);
        body[field] = value;
        let refused = call(&app, "/openai/v1/chat/completions", owner, body).await;
        assert_eq!(refused.status(), 422, "{field}");
        let body: Value = refused.json().await.unwrap();
        assert_eq!(
            body["error"]["code"], "unsupported_parameter",
            "{field}: {body}"
        );
    }
    assert_eq!(
        seen.all().await.len(),
        before,
        "a refused call reached the provider"
    );
    let text = call(
        &app,
        "/openai/v1/chat/completions",
        &capped,
        chat("openai/gpt-test", "hi", false),
    )
    .await;
    assert_eq!(text.status(), 200);
    let mut image = chat("openai/gpt-test", "hi", false);
    image["messages"][0]["content"] = json!([
        { "type": "text", "text": "what is this?" },
        { "type": "image_url", "image_url": { "url": "https://example.com/a.png" } }
    ]);
    let refused = call(&app, "/openai/v1/chat/completions", &capped, image.clone()).await;
    assert_eq!(refused.status(), 402);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "spend_cap_reached", "{body}");
    // The owner's key, uncapped, reserves the window and is billed what was used.
    let answered = call(&app, "/openai/v1/chat/completions", owner, image).await;
    assert_eq!(answered.status(), 200);
}
