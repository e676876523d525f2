//! Usage ingestion and credit admission, each against a baseline measured in the same run.
//!
//! - ingestion: BENCH_USAGE (200 000) samples, then as many events, reported to
//!   `POST /internal/v1/usage` the way workers report them (2 000 per report, 4 reports in
//!   flight), each acknowledged only once committed to PostgreSQL; baseline: the same rows
//!   written straight to PostgreSQL with the same statement, batch size and concurrency (no
//!   HTTP, JSON or validation). The gateway's charger runs meanwhile, as in production; the
//!   time until every sample is charged to the ledger is reported too.
//! - admission: BENCH_ADMISSIONS (10 000) reservations of a sandbox's first minute against a
//!   team's cached balance (the Lua script), one at a time and from 32 tasks at once;
//!   baseline: a Redis `PING` over the same connection.
//!
//! Needs PostgreSQL and Redis (scripts/setup):
//! `cargo bench -p sandbase-gateway --bench usage_pipeline`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use sandbase_api::internal::{NODE_TOKEN_HEADER, UsageEvent, UsageReport, UsageSample};
use sandbase_gateway::testing::internals::{Admission, Admitted};
use sandbase_gateway::{Application, testing};
use serde_json::{Value, json};
use uuid::Uuid;

const NODE_TOKEN: &str = "bench-node-token-0123456789";
const WORKER: &str = "bench-worker";
const SANDBOXES: usize = 1000;
const REPORT: usize = 2000;
const IN_FLIGHT: usize = 4;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn percentile_ms(samples: &mut [Duration], fraction: f64) -> f64 {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * fraction).round() as usize;
    samples[index].as_secs_f64() * 1000.0
}

/// Samples `seq_from..` of every sandbox, `REPORT` to a batch.
fn sample_batches(sandboxes: &[Uuid], seq_from: u64, total: usize) -> Vec<Vec<UsageSample>> {
    let mut all = Vec::with_capacity(total);
    let mut seq = seq_from;
    while all.len() < total {
        for sandbox in sandboxes {
            all.push(UsageSample {
                sandbox: *sandbox,
                seq,
                uptime_ms: seq * 5000,
                cpu_usec: seq * 1000,
                paused_ms: 0,
                last: false,
                sampled_at: Utc::now(),
            });
        }
        seq += 1;
    }
    all.truncate(total);
    all.chunks(REPORT).map(<[UsageSample]>::to_vec).collect()
}

/// Runs `batches` through `send`, IN_FLIGHT at a time; returns the wall time.
async fn drive<T, F, Fut>(batches: Vec<T>, send: F) -> Duration
where
    T: Send + 'static,
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let queue = Arc::new(std::sync::Mutex::new(batches));
    let send = Arc::new(send);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..IN_FLIGHT {
        let (queue, send) = (Arc::clone(&queue), Arc::clone(&send));
        tasks.push(tokio::spawn(async move {
            loop {
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop();
                let Some(batch) = next else { break };
                send(batch).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("sender");
    }
    started.elapsed()
}

async fn ingest_over_http(
    http: &reqwest::Client,
    url: &str,
    samples: Vec<Vec<UsageSample>>,
    events: Vec<Vec<UsageEvent>>,
) -> Duration {
    let reports: Vec<UsageReport> = samples
        .into_iter()
        .map(|samples| UsageReport {
            worker: WORKER.to_owned(),
            samples,
            events: Vec::new(),
            ..Default::default()
        })
        .chain(events.into_iter().map(|events| UsageReport {
            worker: WORKER.to_owned(),
            samples: Vec::new(),
            events,
            ..Default::default()
        }))
        .collect();
    let (http, url) = (http.clone(), format!("{url}/internal/v1/usage"));
    let credential =
        sandbase_gateway::operator::worker_credential(&NODE_TOKEN.to_owned().into(), WORKER);
    drive(reports, move |report| {
        let (http, url, credential) = (http.clone(), url.clone(), credential.clone());
        async move {
            let response = http
                .post(url)
                .header(NODE_TOKEN_HEADER, credential)
                .json(&report)
                .send()
                .await
                .expect("report");
            let status = response.status();
            let receipt: Value = response.json().await.unwrap_or(Value::Null);
            assert!(status.is_success(), "{status}: {receipt}");
            let written =
                receipt["samples"].as_u64().unwrap_or(0) + receipt["events"].as_u64().unwrap_or(0);
            assert_eq!(written as usize, report.samples.len() + report.events.len());
        }
    })
    .await
}

/// The same INSERT the gateway runs (`insert_samples`), straight to PostgreSQL.
async fn ingest_direct(db: &sqlx::PgPool, samples: Vec<Vec<UsageSample>>) -> Duration {
    let db = db.clone();
    drive(samples, move |batch| {
        let db = db.clone();
        async move {
            let mut transaction = db.begin().await.expect("begin");
            sandbase_gateway::testing::internals::insert_samples(&mut transaction, &batch, WORKER)
                .await
                .expect("insert");
            transaction.commit().await.expect("commit");
        }
    })
    .await
}

#[allow(
    clippy::too_many_lines,
    reason = "a benchmark's scenario, measured and reported in one place"
)]
fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::stderr)
        .try_init();
    let total = env_number("BENCH_USAGE", 200_000);
    let admissions = env_number("BENCH_ADMISSIONS", 10_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut settings = testing::settings().await;
        settings.workers.node_token = Some(NODE_TOKEN.to_owned().into());
        settings.billing.starter_credits = "1000000".to_owned();
        use secrecy::ExposeSecret;
        let redis_url = settings.redis.url.as_ref().expect("redis url").expose_secret().to_owned();
        let prefix = settings.redis.key_prefix.clone();
        let database_url = settings.database.url.as_ref().expect("database url");
        let db = sqlx::PgPool::connect(database_url.expose_secret()).await?;
        let application = Application::build(settings).await?;
        let url = format!("http://{}", application.local_addr());
        let internal = format!("http://{}", application.internal_addr());
        tokio::spawn(application.run_until_stopped(std::future::pending()));
        let http = reqwest::Client::new();
        let signup: Value = http
            .post(format!("{url}/v1/auth/signup"))
            .json(&json!({ "email": "bench@example.com", "password": "correct horse battery", "team_name": "Bench" }))
            .send()
            .await?
            .json()
            .await?;
        let team: Uuid = signup["team"]["id"].as_str().expect("team").parse()?;

        // A worker and its sandboxes, as the gateway records placed sandboxes.
        sqlx::query("INSERT INTO workers (id, url, capacity) VALUES ($1, 'http://127.0.0.1:9', $2)")
            .bind(WORKER)
            .bind(SANDBOXES as i32)
            .execute(&db)
            .await?;
        let sandboxes: Vec<Uuid> = (0..SANDBOXES).map(|_| Uuid::now_v7()).collect();
        sqlx::query(
            "INSERT INTO sandboxes (id, team_id, template, state, worker_id, cwd, cpu_millis, memory_mb, disk_mb, pids, expires_at) \
             SELECT id, $2, 'busybox', 'running', $3, '/work', 1000, 1024, 64, 64, now() + interval '1 day' FROM unnest($1::uuid[]) AS id",
        )
        .bind(&sandboxes)
        .bind(team)
        .bind(WORKER)
        .execute(&db)
        .await?;

        // Baseline and gateway take turns (half each, twice) on fresh sequence numbers, so
        // neither gets the emptier table; the baseline's rows are marked charged at once.
        let half = total / 2;
        let mut direct = Duration::ZERO;
        let mut http_samples = Duration::ZERO;
        let charge_from = Instant::now();
        for round in 0..2u64 {
            direct += ingest_direct(&db, sample_batches(&sandboxes, 1_000_000 + round * 1000, half)).await;
            sqlx::query("UPDATE usage_samples SET processed = true WHERE seq >= 1000000")
                .execute(&db)
                .await?;
            http_samples +=
                ingest_over_http(&http, &internal, sample_batches(&sandboxes, 1 + round * 1000, half), Vec::new()).await;
        }
        let events: Vec<UsageEvent> = (0..total)
            .map(|index| UsageEvent {
                key: format!("bench-{index}"),
                sandbox: sandboxes[index % SANDBOXES],
                kind: "egress_bytes".to_owned(),
                subject: String::new(),
                quantity: 1 << 20,
                occurred_at: Utc::now(),
            })
            .collect();
        let event_batches: Vec<Vec<UsageEvent>> =
            events.chunks(REPORT).map(<[UsageEvent]>::to_vec).collect();
        let http_events = ingest_over_http(&http, &internal, Vec::new(), event_batches).await;
        loop {
            let (waiting,): (i64,) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM usage_samples WHERE NOT processed) + \
                        (SELECT count(*) FROM usage_events WHERE NOT processed)",
            )
            .fetch_one(&db)
            .await?;
            if waiting == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let charged_in = charge_from.elapsed();
        let (debits,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM ledger_transactions WHERE kind = 'debit'")
                .fetch_one(&db)
                .await?;

        let rate = |count: usize, took: Duration| count as f64 / took.as_secs_f64();
        println!("## ingestion ({total} of each, {REPORT} a report, {IN_FLIGHT} in flight)");
        println!(
            "direct INSERT (baseline): {:>9.0} samples/s ({:.2} s)",
            rate(total, direct),
            direct.as_secs_f64()
        );
        println!(
            "gateway samples:          {:>9.0} samples/s ({:.2} s) → {:.2} of the baseline",
            rate(total, http_samples),
            http_samples.as_secs_f64(),
            direct.as_secs_f64() / http_samples.as_secs_f64()
        );
        println!(
            "gateway events:           {:>9.0} events/s ({:.2} s) → {:.2} of the baseline",
            rate(total, http_events),
            http_events.as_secs_f64(),
            direct.as_secs_f64() / http_events.as_secs_f64()
        );
        println!(
            "everything charged {:.2} s after the first report ({debits} debits in the ledger)",
            charged_in.as_secs_f64()
        );

        // Admission.
        let client = redis::Client::open(redis_url.as_str())?;
        let manager = redis::aio::ConnectionManager::new(client).await?;
        let admission = Arc::new(Admission::new(manager.clone(), &prefix));
        let reserve = move |admission: Arc<Admission>, db: sqlx::PgPool| async move {
            let started = Instant::now();
            let admitted = admission
                .reserve(&db, team, &[], Uuid::now_v7(), 900, 60_000)
                .await
                .expect("reserve");
            assert_eq!(admitted, Admitted::Yes);
            started.elapsed()
        };
        // Warm the cache (the first call loads the balance from the ledger).
        reserve(Arc::clone(&admission), db.clone()).await;
        let mut ping = Vec::with_capacity(admissions);
        let mut sequential = Vec::with_capacity(admissions);
        for _ in 0..admissions {
            let started = Instant::now();
            let _: String = redis::cmd("PING").query_async(&mut manager.clone()).await?;
            ping.push(started.elapsed());
            sequential.push(reserve(Arc::clone(&admission), db.clone()).await);
        }
        let mut tasks = Vec::new();
        let started = Instant::now();
        for _ in 0..32 {
            let (admission, db) = (Arc::clone(&admission), db.clone());
            let each = admissions / 32;
            tasks.push(tokio::spawn(async move {
                let mut took = Vec::with_capacity(each);
                for _ in 0..each {
                    took.push(reserve(Arc::clone(&admission), db.clone()).await);
                }
                took
            }));
        }
        let mut concurrent = Vec::new();
        for task in tasks {
            concurrent.extend(task.await?);
        }
        let concurrent_wall = started.elapsed();
        let ping_p50 = percentile_ms(&mut ping, 0.5);
        let ping_p99 = percentile_ms(&mut ping, 0.99);
        let seq_p50 = percentile_ms(&mut sequential, 0.5);
        let seq_p99 = percentile_ms(&mut sequential, 0.99);
        println!("## admission ({admissions} reservations)");
        println!("redis PING (baseline):    p50 {ping_p50:.3} ms  p99 {ping_p99:.3} ms");
        println!(
            "reserve, one at a time:   p50 {seq_p50:.3} ms  p99 {seq_p99:.3} ms → {:.2}× / {:.2}× PING",
            seq_p50 / ping_p50,
            seq_p99 / ping_p99
        );
        println!(
            "reserve, 32 tasks:        p50 {:.3} ms  p99 {:.3} ms, {:.0} decisions/s",
            percentile_ms(&mut concurrent, 0.5),
            percentile_ms(&mut concurrent, 0.99),
            concurrent.len() as f64 / concurrent_wall.as_secs_f64()
        );
        Ok::<_, anyhow::Error>(())
    })
}
