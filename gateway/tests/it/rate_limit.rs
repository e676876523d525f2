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
