//! The store's budgets under pressure: a key's spend cap reached by its calls, and a Redis
//! flush in the middle of concurrent calls (admission rebuilds its budgets from the ledger;
//! every admitted call is billed exactly and the balance stays above zero).

use std::time::Duration;

use serde_json::json;

use crate::store::{available, call, chat, settled, store_app, text_of};

/// A key capped at 0.05 credits calls a model whose worst case is about 0.0104 credits and
/// whose calls cost 0.00275: it is refused with `spend_cap_reached` before its calls could
/// cost more than the cap, and what they cost is what the key spent.
#[tokio::test]
async fn a_keys_cap_holds_for_its_store_calls() {
    let (app, _) = store_app().await;
    let team = app.signup("capped@example.com", "Capped").await;
    let created = app
        .post(
            "/v1/api-keys",
            &team.api_key.token,
            json!({ "name": "capped", "max_credits": "0.05" }),
        )
        .await;
    let key = created.body["token"].as_str().unwrap().to_owned();
    let mut admitted = 0;
    let refusal = loop {
        let answer = call(
            &app,
            "/openai/v1/chat/completions",
            &key,
            chat("openai/gpt-test", "hi", false),
        )
        .await;
        if answer.status() != 200 {
            break answer;
        }
        settled(&app, &answer).await;
        admitted += 1;
        assert!(admitted <= 20, "the cap never held");
    };
    assert_eq!(refusal.status(), 402);
    let body: serde_json::Value = refusal.json().await.unwrap();
    assert_eq!(body["error"]["code"], "spend_cap_reached", "{body}");
    assert!(admitted >= 3, "{admitted} calls admitted");
    let spent = app
        .count(&format!(
            "SELECT spent_micro FROM api_keys WHERE id = '{}'",
            created.body["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(spent, admitted * 2750);
    assert!(spent <= 50_000);
}

/// Concurrent streaming calls, the gateway's Redis keys flushed half-way: later calls are
/// admitted against budgets rebuilt from the ledger, every admitted call is billed exactly
/// once, and the balance never goes below zero.
#[tokio::test]
async fn a_redis_flush_mid_load_loses_no_charge() {
    let (app, _) = store_app().await;
    let team = app.signup("flush@example.com", "Flush").await;
    let key = team.api_key.token.clone();
    let wave = || {
        let (app, key) = (&app, key.as_str());
        futures_util::future::join_all((0..10).map(move |_| async move {
            let answer = call(
                app,
                "/openai/v1/chat/completions",
                key,
                chat("openai/gpt-dear", "slow", true),
            )
            .await;
            let status = answer.status().as_u16();
            (status, text_of(answer).await)
        }))
    };
    let flush = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let client = redis::Client::open(sandbase_gateway::testing::redis_url()).unwrap();
        let mut redis = client.get_multiplexed_async_connection().await.unwrap();
        let pattern = format!("{}*", app.settings.redis.key_prefix);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(!keys.is_empty(), "nothing under {pattern}");
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut redis)
            .await
            .unwrap();
    };
    let (first, (), second) = tokio::join!(wave(), flush, async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        wave().await
    });
    let answers: Vec<&(u16, String)> = first.iter().chain(second.iter()).collect();
    let admitted = answers.iter().filter(|(status, _)| *status == 200).count() as i64;
    for (status, body) in &answers {
        assert!(
            *status == 200 || (*status == 402 && body.contains("insufficient_credits")),
            "{status}: {body}"
        );
    }
    assert!(admitted >= 1);
    crate::testbed::wait_until("every call settled", Duration::from_secs(20), || async {
        app.count("SELECT count(*) FROM store_requests").await == admitted
    })
    .await;
    let billed = app
        .count("SELECT sum(cost_micro)::bigint FROM store_requests")
        .await;
    assert_eq!(billed, admitted * 100_250);
    let left = available(&app, &key).await;
    assert_eq!(left, 10_000_000 - billed);
    assert!(left >= 0);
}
