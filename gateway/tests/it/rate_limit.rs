use std::time::Duration;

use crate::helpers::{email, spawn_app};

#[tokio::test]
async fn bursts_above_the_team_limit_get_429_and_recover() {
    let app = spawn_app().await;
    let owner = app.signup(&email("limited"), "Limited").await;
    let key = owner.api_key.token.clone();
    app.set_rate_limit(owner.team.id, Some((2, 5))).await;

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
    app.set_rate_limit(owner.team.id, None).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answers = futures_util::future::join_all((0..20).map(|_| app.get("/v1/me", &key))).await;
    assert!(answers.iter().all(|answer| answer.status == 200));
}

#[tokio::test]
async fn a_hot_key_is_held_to_its_limit_across_gateways() {
    let first = spawn_app().await;
    let second = crate::helpers::spawn_with_settings(first.settings.clone()).await;
    let owner = first.signup(&email("hot"), "Hot").await;
    // 100/s with a burst of 100: each gateway leases 5 tokens at a time.
    first.set_rate_limit(owner.team.id, Some((100, 100))).await;
    let key = owner.api_key.token.clone();
    let started = std::time::Instant::now();
    let requests = (0..400).map(|index| {
        let app = if index % 2 == 0 { &first } else { &second };
        app.get("/v1/me", &key)
    });
    let answers = futures_util::future::join_all(requests).await;
    let elapsed = started.elapsed().as_secs_f64();
    let admitted = answers.iter().filter(|answer| answer.status == 200).count() as f64;
    assert!(
        answers
            .iter()
            .all(|answer| matches!(answer.status.as_u16(), 200 | 429))
    );
    println!("{admitted} of 400 admitted in {elapsed:.3} s");
    // Never more than the burst, what the rate refilled meanwhile, and one lease per gateway.
    let ceiling = 100.0 + 100.0 * elapsed + 2.0 * 5.0;
    assert!(
        admitted <= ceiling,
        "{admitted} admitted in {elapsed:.2} s (ceiling {ceiling:.0})"
    );
    // Leases may strand a few tokens, never most of the burst.
    assert!(admitted >= 80.0, "only {admitted} admitted");
}

#[tokio::test]
async fn minting_keys_does_not_multiply_a_teams_rate() {
    let app = crate::helpers::spawn_app_with(|settings| {
        settings.rate_limit.per_second = 5;
        settings.rate_limit.burst = 10;
        settings.rate_limit.team_per_second = 5;
        settings.rate_limit.team_burst = 20;
    })
    .await;
    let owner = app.signup(&email("mint"), "Mint").await;
    let mut keys = vec![owner.api_key.token.clone()];
    for index in 0..5 {
        let (_, key) = app
            .create_key(
                &owner.api_key.token,
                serde_json::json!({ "name": format!("k{index}") }),
            )
            .await;
        keys.push(key);
    }
    // Let the buckets the key creations used refill.
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Six keys with a burst of 10 each would admit 60 at once; the team's ceiling is 20.
    let requests = (0..120).map(|index| app.get("/v1/me", &keys[index % keys.len()]));
    let answers = futures_util::future::join_all(requests).await;
    let admitted = answers.iter().filter(|answer| answer.status == 200).count();
    // The team's burst of 20, a few more refilled while the requests are served (60 without
    // the ceiling).
    assert!((18..=30).contains(&admitted), "{admitted} of 120 admitted");
    assert!(
        answers
            .iter()
            .all(|answer| answer.status == 200 || answer.status == 429)
    );
    // Another team has a ceiling of its own.
    let other = app.signup(&email("other-mint"), "Other").await;
    assert_eq!(app.get("/v1/me", &other.api_key.token).await.status, 200);
}
