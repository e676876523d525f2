use std::time::Duration;

use sandbase_gateway::admin;
use sandbase_gateway::startup::connect_redis;

use crate::helpers::{email, spawn_app};

#[tokio::test]
async fn bursts_above_the_team_limit_get_429_and_recover() {
    let app = spawn_app().await;
    let owner = app.signup(&email("limited"), "Limited").await;
    let key = owner.api_key.token.clone();
    let redis = connect_redis(&app.settings).await.unwrap();
    admin::set_team_rate_limit(
        &app.db,
        redis,
        &app.settings.redis.key_prefix,
        owner.team.id,
        Some((2, 5)),
    )
    .await
    .unwrap();

    // 20 requests at once against a burst of 5 at 2/s.
    let answers = futures_util::future::join_all((0..20).map(|_| app.get("/v1/me", &key))).await;
    let ok = answers.iter().filter(|answer| answer.status == 200).count();
    let limited: Vec<_> = answers
        .iter()
        .filter(|answer| answer.status == 429)
        .collect();
    assert_eq!(ok + limited.len(), 20);
    assert!((5..=6).contains(&ok), "{ok} admitted");
    let retry_after: u64 = limited[0].headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&retry_after), "Retry-After {retry_after}");
    limited[0].assert_error(429, "rate_limited");

    // Other teams are not affected.
    let other = app.signup(&email("unlimited"), "Other").await;
    assert_eq!(app.get("/v1/me", &other.api_key.token).await.status, 200);

    // After the advertised wait, requests are admitted again.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    assert_eq!(app.get("/v1/me", &key).await.status, 200);

    // Cleared back to the (high) default.
    let redis = connect_redis(&app.settings).await.unwrap();
    admin::set_team_rate_limit(
        &app.db,
        redis,
        &app.settings.redis.key_prefix,
        owner.team.id,
        None,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answers = futures_util::future::join_all((0..20).map(|_| app.get("/v1/me", &key))).await;
    assert!(answers.iter().all(|answer| answer.status == 200));
}
