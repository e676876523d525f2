//! Scale beyond the machine, simulated: BENCH_WORKERS (50) workers speaking the internal API
//! to one gateway — registered, then heartbeating once a second, each listing its share of
//! BENCH_SANDBOXES (10 000) sandboxes (rows in PostgreSQL as the gateway placed them) — and
//! reporting usage. Each figure against a baseline measured in the same run:
//!
//! - heartbeat cost: the process's CPU time (gateway and simulated workers together, so an
//!   upper bound of the gateway's) over BENCH_SECONDS (20) of 1 Hz heartbeats, in cores;
//!   baseline: as many heartbeats from as many other workers hosting nothing (a heartbeat's
//!   fixed cost: TLS, authentication, JSON, Redis).
//! - placement: the gateway's choice of a worker for a sandbox (`Workers::candidates`, over
//!   the live workers' statuses in Redis — the baseline's idle workers included, so twice
//!   BENCH_WORKERS) 10 000 times, p50/p99; baseline: reading the
//!   workers' hash from Redis (`HVALS`), which a placement does at most every half second.
//! - ingestion at scale: usage events reported as fast as 4 workers can (2 000 per report)
//!   while samples of every sandbox stream in at BENCH_SAMPLE_RATE (2 000/s), events/s;
//!   baseline: the same events with no sample stream.
//!
//! Needs PostgreSQL and Redis (scripts/setup): `cargo bench -p sandbase-gateway --bench scale`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use sandbase_api::internal::{
    Heartbeat, NODE_TOKEN_HEADER, RegisterWorker, TemplateInfo, UsageEvent, UsageReport,
    UsageSample,
};
use sandbase_api::sandboxes::Isolation;
use sandbase_gateway::{Application, testing};
use serde_json::{Value, json};
use uuid::Uuid;

const NODE_TOKEN: &str = "bench-node-token-0123456789";

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

/// This process's CPU time (user + system) so far.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 (11 and 12 after the command), in clock ticks
    // of 1/100 s on Linux.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

struct Sim {
    http: reqwest::Client,
    internal: String,
    workers: Vec<(String, String, Vec<Uuid>)>,
}

impl Sim {
    fn heartbeat(&self, index: usize) -> Heartbeat {
        let (id, _, sandboxes) = &self.workers[index];
        Heartbeat {
            id: id.clone(),
            url: format!("http://127.0.0.1:{}", 20_000 + index),
            capacity: (sandboxes.len() + 50) as u32,
            templates: vec![TemplateInfo {
                name: "base".to_owned(),
                warm: 2,
            }],
            volumes: Vec::new(),
            sandboxes: sandboxes.clone(),
            paused: Vec::new(),
            healthy: true,
            memory_mb: 1 << 20,
            reserved_memory_mb: 0,
            cpu_millis: 1 << 20,
            reserved_cpu_millis: 0,
            isolations: vec![Isolation::Runc],
        }
    }

    /// Every worker heartbeats once a second for `seconds`; the CPU time spent and each
    /// call's duration.
    async fn once_a_second(self: &Arc<Self>, seconds: u64) -> (Duration, Vec<Duration>) {
        let cpu = cpu_time();
        let mut tasks = Vec::new();
        for index in 0..self.workers.len() {
            let sim = Arc::clone(self);
            tasks.push(tokio::spawn(async move {
                let mut timings = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                for _ in 0..seconds {
                    tick.tick().await;
                    let (id, credential, _) = &sim.workers[index];
                    let started = Instant::now();
                    let request = sim
                        .http
                        .post(format!("{}/internal/v1/workers/heartbeat", sim.internal))
                        .json(&sim.heartbeat(index));
                    let answer = request.header(NODE_TOKEN_HEADER, credential).send().await;
                    let status = answer.map(|answer| answer.status().as_u16()).unwrap_or(0);
                    assert!((200..300).contains(&status), "{id}: {status}");
                    timings.push(started.elapsed());
                }
                timings
            }));
        }
        let mut timings = Vec::new();
        for task in tasks {
            timings.extend(task.await.expect("worker task"));
        }
        (cpu_time() - cpu, timings)
    }

    /// Events reported by the first four workers (2 000 per report, one report in flight
    /// each) for `seconds`, while `sample_rate` samples a second stream in from the rest;
    /// events written per second.
    async fn ingest(self: &Arc<Self>, seconds: u64, sample_rate: usize, offset: u64) -> f64 {
        let stop = Arc::new(AtomicBool::new(false));
        let mut samplers = Vec::new();
        if sample_rate > 0 {
            let sim = Arc::clone(self);
            let stop = Arc::clone(&stop);
            samplers.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                let mut seq = offset;
                let per_tick = sample_rate / 10;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    seq += 1;
                    let index = 4 + (seq as usize % (sim.workers.len() - 4));
                    let (id, credential, sandboxes) = &sim.workers[index];
                    let samples: Vec<UsageSample> = (0..per_tick)
                        .map(|n| UsageSample {
                            sandbox: sandboxes[n % sandboxes.len()],
                            seq: seq * 10_000 + n as u64,
                            uptime_ms: seq * 1000,
                            cpu_usec: seq * 100,
                            paused_ms: 0,
                            last: false,
                            sampled_at: Utc::now(),
                        })
                        .collect();
                    let report = UsageReport {
                        worker: id.clone(),
                        samples,
                        ..Default::default()
                    };
                    let _ = sim
                        .http
                        .post(format!("{}/internal/v1/usage", sim.internal))
                        .header(NODE_TOKEN_HEADER, credential)
                        .json(&report)
                        .send()
                        .await;
                }
            }));
        }
        let started = Instant::now();
        let mut reporters = Vec::new();
        for index in 0..4 {
            let sim = Arc::clone(self);
            reporters.push(tokio::spawn(async move {
                let (id, credential, sandboxes) = &sim.workers[index];
                let mut written = 0u64;
                let mut batch = 0u64;
                while started.elapsed() < Duration::from_secs(seconds) {
                    batch += 1;
                    let events: Vec<UsageEvent> = (0..2000)
                        .map(|n| UsageEvent {
                            key: format!("scale-{offset}-{batch}-{n}"),
                            sandbox: sandboxes[n % sandboxes.len()],
                            kind: "egress_bytes".to_owned(),
                            subject: String::new(),
                            quantity: 1 << 20,
                            occurred_at: Utc::now(),
                        })
                        .collect();
                    let report = UsageReport {
                        worker: id.clone(),
                        events,
                        ..Default::default()
                    };
                    let receipt: Value = sim
                        .http
                        .post(format!("{}/internal/v1/usage", sim.internal))
                        .header(NODE_TOKEN_HEADER, credential)
                        .json(&report)
                        .send()
                        .await
                        .expect("report")
                        .json()
                        .await
                        .expect("receipt");
                    written += receipt["events"].as_u64().unwrap_or(0);
                }
                written
            }));
        }
        let mut written = 0;
        for reporter in reporters {
            written += reporter.await.expect("reporter");
        }
        let rate = written as f64 / started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for sampler in samplers {
            let _ = sampler.await;
        }
        rate
    }
}

/// A team, the workers registered, and each worker's sandboxes recorded as placed.
async fn topology(
    db: &sqlx::PgPool,
    http: &reqwest::Client,
    (url, internal): (&str, &str),
    (workers, sandboxes): (usize, usize),
    name: &str,
) -> anyhow::Result<Sim> {
    let signup: Value = http
        .post(format!("{url}/v1/auth/signup"))
        .json(&json!({ "email": format!("{name}@example.com"), "password": "correct horse battery", "team_name": "Scale" }))
        .send()
        .await?
        .json()
        .await?;
    let team: Uuid = signup["team"]["id"].as_str().expect("team").parse()?;
    let mut all = Vec::new();
    for index in 0..workers {
        let id = format!("{name}-{index}");
        let credential =
            sandbase_gateway::operator::worker_credential(&NODE_TOKEN.to_owned().into(), &id);
        let registered = http
            .post(format!("{internal}/internal/v1/workers/register"))
            .header(NODE_TOKEN_HEADER, &credential)
            .json(&RegisterWorker {
                id: id.clone(),
                url: format!("http://127.0.0.1:{}", 20_000 + index),
                capacity: (sandboxes / workers + 50) as u32,
                templates: vec![TemplateInfo {
                    name: "base".to_owned(),
                    warm: 2,
                }],
                volumes: Vec::new(),
                isolations: vec![Isolation::Runc],
            })
            .send()
            .await?;
        assert!(registered.status().is_success(), "{}", registered.status());
        let mine: Vec<Uuid> = (0..sandboxes / workers).map(|_| Uuid::now_v7()).collect();
        sqlx::query(
            "INSERT INTO sandboxes (id, team_id, template, state, worker_id, cwd, cpu_millis, memory_mb, disk_mb, pids, expires_at) \
             SELECT id, $2, 'base', 'running', $3, '/work', 1000, 1024, 64, 64, now() + interval '1 day' FROM unnest($1::uuid[]) AS id",
        )
        .bind(&mine)
        .bind(team)
        .bind(&id)
        .execute(db)
        .await?;
        all.push((id, credential, mine));
    }
    Ok(Sim {
        http: http.clone(),
        internal: internal.to_owned(),
        workers: all,
    })
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
    let workers = env_number("BENCH_WORKERS", 50);
    let sandboxes = env_number("BENCH_SANDBOXES", 10_000);
    let seconds = env_number("BENCH_SECONDS", 20) as u64;
    let sample_rate = env_number("BENCH_SAMPLE_RATE", 2_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut settings = testing::settings().await;
        settings.workers.node_token = Some(NODE_TOKEN.to_owned().into());
        settings.workers.heartbeat_ttl_secs = 30;
        settings.workers.lost_after_secs = 60;
        settings.billing.starter_credits = "1000000".to_owned();
        use secrecy::ExposeSecret;
        let database_url = settings.database.url.as_ref().expect("database url");
        let db = sqlx::PgPool::connect(database_url.expose_secret()).await?;
        let redis_url = settings.redis.url.as_ref().expect("redis url").expose_secret().to_owned();
        let workers_key = format!("{}workers", settings.redis.key_prefix);
        let scheme = if settings.internal_tls.is_some() { "https" } else { "http" };
        let application = Application::build(settings).await?;
        let url = format!("http://{}", application.local_addr());
        let internal = format!("{scheme}://{}", application.internal_addr());
        let inspector = testing::Inspector::new(&application);
        tokio::spawn(application.run_until_stopped(std::future::pending()));
        // The internal channel's TLS, as workers have it.
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(testing::channel().client.as_ref().clone())
            .pool_max_idle_per_host(256)
            .build()?;
        let addresses = (url.as_str(), internal.as_str());
        // The baseline of the heartbeats first (before any usage gives the charger work):
        // as many workers hosting nothing. They stay live for the placements below.
        let idle = Arc::new(topology(&db, &http, addresses, (workers, 0), "idle").await?);
        let (idle_cpu, mut idle_beats) = idle.once_a_second(seconds).await;
        let sim = Arc::new(topology(&db, &http, addresses, (workers, sandboxes), "sim").await?);
        let (beat_cpu, mut beats) = sim.once_a_second(seconds).await;

        let team = Uuid::now_v7();
        let mut placed = Vec::with_capacity(10_000);
        for _ in 0..10_000 {
            let started = Instant::now();
            let candidates = inspector.placement_candidates("base", Isolation::Runc, team).await?;
            placed.push(started.elapsed());
            // The idle baseline's workers are live too: twice as many to choose from.
            assert_eq!(candidates, 2 * workers);
        }
        let redis = redis::Client::open(redis_url)?;
        let mut connection = redis.get_multiplexed_async_connection().await?;
        let mut reads = Vec::with_capacity(1000);
        for _ in 0..1000 {
            let started = Instant::now();
            let _: Vec<String> = redis::cmd("HVALS").arg(&workers_key).query_async(&mut connection).await?;
            reads.push(started.elapsed());
        }
        println!(
            "placement over {} live workers: p50 {:.3} ms, p99 {:.3} ms; baseline HVALS of the workers: p50 {:.3} ms, p99 {:.3} ms",
            2 * workers,
            percentile_ms(&mut placed, 0.5),
            percentile_ms(&mut placed, 0.99),
            percentile_ms(&mut reads, 0.5),
            percentile_ms(&mut reads, 0.99),
        );

        let alone = sim.ingest(seconds / 2, 0, 1).await;
        let streamed = sim.ingest(seconds / 2, sample_rate, 2).await;

        let cores = |cpu: Duration| cpu.as_secs_f64() / seconds as f64;
        println!(
            "heartbeats: {workers} workers at 1 Hz listing {sandboxes} sandboxes: {:.3} cores (p50 {:.2} ms, p99 {:.2} ms); baseline {workers} workers hosting nothing: {:.3} cores (p50 {:.2} ms); ratio {:.2}",
            cores(beat_cpu),
            percentile_ms(&mut beats, 0.5),
            percentile_ms(&mut beats, 0.99),
            cores(idle_cpu),
            percentile_ms(&mut idle_beats, 0.5),
            cores(beat_cpu) / cores(idle_cpu).max(1e-9),
        );
        println!(
            "ingestion: {streamed:.0} events/s with {sample_rate} samples/s streaming in; baseline {alone:.0} events/s alone; ratio {:.2}",
            streamed / alone
        );
        Ok::<(), anyhow::Error>(())
    })
}
