//! What authentication and rate limiting cost per request.
//!
//! Runs one gateway (real PostgreSQL and Redis, as in the tests) and drives two endpoints
//! with the same load generator in the same run: `GET /healthz` (no auth) as the baseline and
//! `GET /v1/me` with an API key (key lookup, rate-limit script in Redis, JSON answer). Phases
//! alternate to spread drift evenly. Prints throughput, p50 and p99 of each and the overhead.
//!
//! `cargo bench -p sandbase-gateway --bench auth_overhead` (needs scripts/setup's services).
//! Environment: BENCH_CONCURRENCY (32), BENCH_SECONDS per phase (5), BENCH_ROUNDS (2),
//! BENCH_PACED_RATE (4000 requests/s in all).
//!
//! Two load shapes: closed loop (each of the 32 connections sends as fast as answers come,
//! which saturates this machine's cores — latency then mostly measures queueing behind the
//! throughput limit) and paced (the same 32 connections sending at a fixed total rate below
//! saturation) — the latency a caller sees when the gateway is not overloaded. Paced latency
//! is measured from the moment each request is sent (the timer that schedules it is only
//! millisecond-precise); a sender that falls behind its schedule sends at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sandbase_gateway::{Application, operator, testing};
use secrecy::ExposeSecret;
use sqlx::PgPool;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

struct Phase {
    latencies_us: Vec<u64>,
    elapsed: Duration,
}

impl Phase {
    fn percentile(&self, fraction: f64) -> f64 {
        let index = ((self.latencies_us.len() as f64 - 1.0) * fraction).round() as usize;
        self.latencies_us[index] as f64 / 1000.0
    }

    fn requests_per_second(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64()
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "a benchmark's scenario, measured and reported in one place"
)]
fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let concurrency = env_number("BENCH_CONCURRENCY", 32) as usize;
    let seconds = env_number("BENCH_SECONDS", 5);
    let rounds = env_number("BENCH_ROUNDS", 2);

    // The server gets its own runtime with the machine's worker threads, on its own threads.
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("server runtime");
    let (address, settings) = server_runtime.block_on(async {
        let mut settings = testing::settings().await;
        settings.database.max_connections = 20;
        let application = Application::build(settings.clone()).await.expect("build");
        let address = format!("http://{}", application.local_addr());
        tokio::spawn(application.run_until_stopped(std::future::pending()));
        (address, settings)
    });

    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("client runtime");
    client_runtime.block_on(async move {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(concurrency)
            .build()
            .expect("client");
        let signup: serde_json::Value = client
            .post(format!("{address}/v1/auth/signup"))
            .json(&serde_json::json!({
                "email": format!("bench-{}@example.com", uuid::Uuid::new_v4().simple()),
                "password": "benchmark password",
                "team_name": "Bench",
            }))
            .send()
            .await
            .expect("signup")
            .json()
            .await
            .expect("signup body");
        let key = signup["api_key"]["token"].as_str().expect("token").to_owned();
        let team_id = signup["team"]["id"].as_str().expect("team").parse().expect("uuid");
        let db = PgPool::connect(settings.database.url.as_ref().expect("url").expose_secret())
            .await
            .expect("db");
        // A limit above what this machine can serve: the limiter runs on every request (a
        // key this hot leases 1/20 s of tokens from Redis at a time) but never says no.
        let redis = sandbase_gateway::connect_redis(&settings).await.expect("redis");
        operator::set_team_rate_limit(&db, redis, &settings.redis.key_prefix, team_id, Some((100_000, 100_000)))
            .await
            .expect("rate limit");

        println!("concurrency {concurrency}, {seconds} s per phase, {rounds} rounds; warming up");
        run_phase(&client, &format!("{address}/healthz"), None, concurrency, Duration::from_secs(1)).await;
        run_phase(&client, &format!("{address}/v1/me"), Some(&key), concurrency, Duration::from_secs(1)).await;

        let mut baseline = Vec::new();
        let mut authenticated = Vec::new();
        let mut postgres_transactions = 0;
        for _ in 0..rounds {
            baseline.extend(
                run_phase(&client, &format!("{address}/healthz"), None, concurrency, Duration::from_secs(seconds))
                    .await
                    .latencies_us,
            );
            let before = transactions(&db).await;
            let phase =
                run_phase(&client, &format!("{address}/v1/me"), Some(&key), concurrency, Duration::from_secs(seconds))
                    .await;
            // Statistics are published about once a second; wait for them.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            postgres_transactions += transactions(&db).await - before;
            authenticated.push(phase);
        }
        let paced_rate = env_number("BENCH_PACED_RATE", 4000);
        let mut paced_baseline = run_paced(&client, &format!("{address}/healthz"), None, concurrency, paced_rate, Duration::from_secs(seconds)).await;
        let mut paced_me = run_paced(&client, &format!("{address}/v1/me"), Some(&key), concurrency, paced_rate, Duration::from_secs(seconds)).await;
        paced_baseline.latencies_us.sort_unstable();
        paced_me.latencies_us.sort_unstable();

        let baseline_elapsed = Duration::from_secs(seconds * rounds);
        let mut baseline = Phase {
            latencies_us: baseline,
            elapsed: baseline_elapsed,
        };
        let mut me = Phase {
            latencies_us: authenticated.iter().flat_map(|phase| phase.latencies_us.clone()).collect(),
            elapsed: authenticated.iter().map(|phase| phase.elapsed).sum(),
        };
        baseline.latencies_us.sort_unstable();
        me.latencies_us.sort_unstable();

        let rows = [
            ("closed loop", "GET /healthz (no auth)", &baseline),
            ("closed loop", "GET /v1/me (API key)", &me),
            ("paced", "GET /healthz (no auth)", &paced_baseline),
            ("paced", "GET /v1/me (API key)", &paced_me),
        ];
        println!();
        println!("| load | endpoint | requests | req/s | p50 ms | p99 ms |");
        println!("|---|---|---|---|---|---|");
        for (load, name, phase) in rows {
            println!(
                "| {load} | {name} | {} | {:.0} | {:.3} | {:.3} |",
                phase.latencies_us.len(),
                phase.requests_per_second(),
                phase.percentile(0.50),
                phase.percentile(0.99)
            );
        }
        println!();
        println!(
            "closed loop: /v1/me vs /healthz p50 {:+.3} ms, p99 {:+.3} ms, throughput ratio {:.2}",
            me.percentile(0.50) - baseline.percentile(0.50),
            me.percentile(0.99) - baseline.percentile(0.99),
            me.requests_per_second() / baseline.requests_per_second()
        );
        println!(
            "paced at {paced_rate}/s: /v1/me vs /healthz p50 {:+.3} ms, p99 {:+.3} ms",
            paced_me.percentile(0.50) - paced_baseline.percentile(0.50),
            paced_me.percentile(0.99) - paced_baseline.percentile(0.99),
        );
        println!(
            "PostgreSQL transactions during the /v1/me phases: {postgres_transactions} for {} requests \
             (the batched last-used writer and the statistics query itself)",
            me.latencies_us.len()
        );
    });
    drop(server_runtime);
}

async fn transactions(db: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(db)
        .await
        .expect("pg_stat_database")
}

/// `concurrency` senders at `rate` requests/s in all, each on a fixed schedule.
async fn run_paced(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    concurrency: usize,
    rate: u64,
    duration: Duration,
) -> Phase {
    let period = Duration::from_secs_f64(concurrency as f64 / rate.max(1) as f64);
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|index| {
            let client = client.clone();
            let url = reqwest::Url::parse(url).expect("url");
            let key = key.map(str::to_owned);
            // Spread the senders over one period so they do not fire together.
            let first = started + period.mul_f64(index as f64 / concurrency as f64);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut scheduled = first;
                while scheduled < started + duration {
                    tokio::time::sleep_until(scheduled.into()).await;
                    let mut request = client.get(url.clone());
                    if let Some(key) = &key {
                        request = request.bearer_auth(key);
                    }
                    let begun = Instant::now();
                    let response = request.send().await.expect("request");
                    assert_eq!(response.status(), 200, "{url}");
                    response.bytes().await.expect("body");
                    latencies.push(begun.elapsed().as_micros() as u64);
                    scheduled += period;
                }
                latencies
            })
        })
        .collect();
    let mut latencies_us = Vec::new();
    for worker in workers {
        latencies_us.extend(worker.await.expect("worker"));
    }
    Phase {
        latencies_us,
        elapsed: started.elapsed(),
    }
}

async fn run_phase(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    concurrency: usize,
    duration: Duration,
) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let client = client.clone();
            // Parsed once: the load generator should spend its time on requests, not URLs.
            let url = reqwest::Url::parse(url).expect("url");
            let key = key.map(str::to_owned);
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 14);
                while !stop.load(Ordering::Relaxed) {
                    let mut request = client.get(url.clone());
                    if let Some(key) = &key {
                        request = request.bearer_auth(key);
                    }
                    let begun = Instant::now();
                    let response = request.send().await.expect("request");
                    assert_eq!(response.status(), 200, "{url}");
                    response.bytes().await.expect("body");
                    latencies.push(begun.elapsed().as_micros() as u64);
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies_us = Vec::new();
    for worker in workers {
        latencies_us.extend(worker.await.expect("worker"));
    }
    Phase {
        latencies_us,
        elapsed: started.elapsed(),
    }
}
