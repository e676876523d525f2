//! A gateway's key cache when its invalidation subscription dies silently: Redis reached
//! through a relay the test stalls (bytes stop flowing, no connection closes, as in a network
//! partition). A key revoked through another gateway stops working on the stalled one within
//! its ping (or, with the ping far away, within the cache's TTL), and the gateway serves as
//! before once Redis is back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{TestApp, email, spawn_app, spawn_with_settings};

/// A TCP relay to Redis whose traffic can be held up.
struct StallingRelay {
    address: std::net::SocketAddr,
    stalled: Arc<AtomicBool>,
}

impl StallingRelay {
    async fn start(upstream: std::net::SocketAddr) -> StallingRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let stalled = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stalled);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(client_read, server_write, Arc::clone(&flag)));
                tokio::spawn(pump(server_read, client_write, Arc::clone(&flag)));
            }
        });
        StallingRelay { address, stalled }
    }

    fn stall(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stalled: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let Ok(read) = from.read(&mut buffer).await else {
            return;
        };
        if read == 0 {
            return;
        }
        while stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

/// A replica of `app` whose Redis is behind `relay`, with its own cache timing.
async fn replica_through(
    app: &TestApp,
    relay: &StallingRelay,
    ttl_secs: u64,
    ping_secs: u64,
) -> TestApp {
    let mut settings = app.settings.clone();
    settings.redis.url = Some(format!("redis://{}", relay.address).into());
    settings.auth.key_cache_ttl_secs = ttl_secs;
    settings.auth.key_cache_ping_secs = ping_secs;
    let replica = spawn_with_settings(settings).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !replica.state.key_cache_is_live() {
        assert!(Instant::now() < deadline, "the replica never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replica
}

/// How long until `app` refuses `token` (panics after `limit`).
async fn refused_after(app: &TestApp, token: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let answer = app.get("/v1/me", token).await;
        if answer.status == 401 {
            answer.assert_error(401, "api_key_revoked");
            return started.elapsed();
        }
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(
            started.elapsed() < limit,
            "a revoked key still worked after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_key_stops_working_on_a_gateway_whose_subscription_stalled() {
    let first = spawn_app().await;
    let redis: std::net::SocketAddr = crate::helpers::redis_address();
    let relay = StallingRelay::start(redis).await;
    // One replica pings its subscription every second; the other pings rarely and relies
    // on its entries' TTL of three seconds.
    let pinged = replica_through(&first, &relay, 600, 1).await;
    let expiring = replica_through(&first, &relay, 3, 60).await;
    let owner = first.signup(&email("stall"), "Stall").await;
    let (id, token) = first
        .create_key(&owner.api_key.token, json!({ "name": "cached" }))
        .await;
    for replica in [&pinged, &expiring] {
        for _ in 0..3 {
            assert_eq!(replica.get("/v1/me", &token).await.status, 200);
        }
    }
    relay.stall(true);
    let answer = first
        .delete(&format!("/v1/api-keys/{id}"), &owner.api_key.token)
        .await;
    assert_eq!(answer.status, 204);
    let (by_ping, by_ttl) = tokio::join!(
        refused_after(&pinged, &token, Duration::from_secs(8)),
        refused_after(&expiring, &token, Duration::from_secs(8)),
    );
    println!(
        "revocation seen through a stalled subscription: {by_ping:?} (ping), {by_ttl:?} (TTL)"
    );
    // Redis back: both subscribe again and serve the owner's key from their caches.
    relay.stall(false);
    for replica in [&pinged, &expiring] {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !replica.state.key_cache_is_live() {
            assert!(
                Instant::now() < deadline,
                "the replica never subscribed again"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            replica.get("/v1/me", &owner.api_key.token).await.status,
            200
        );
    }
}
