//! Helpers for tests against real PostgreSQL and Redis (the `testing` feature).
//!
//! Every test gets its own database (`sandbase_test_<id>`, created from
//! `SANDBASE_TEST_DATABASE_URL`) and its own Redis key prefix, so tests run in parallel
//! without seeing each other. `scripts/test` drops the databases of earlier runs.

use std::str::FromStr;

use secrecy::SecretString;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use uuid::Uuid;

use crate::config::Settings;
use crate::startup::Application;
use crate::state::AppState;

pub const DEFAULT_DATABASE_URL: &str = "postgres://sandbase:sandbase@127.0.0.1:5432/sandbase";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// The internal channel of every test gateway and worker of this process: a CA and one
/// certificate for 127.0.0.1 and localhost, generated once and written to a private
/// directory.
pub fn channel_files() -> sandbase_egress::channel::ChannelFiles {
    static FILES: std::sync::OnceLock<sandbase_egress::channel::ChannelFiles> =
        std::sync::OnceLock::new();
    FILES
        .get_or_init(|| {
            let (ca, certificate, key) =
                sandbase_egress::channel::generate(&["127.0.0.1", "localhost"])
                    .expect("generate the test channel's certificates");
            let directory = std::env::temp_dir()
                .join(format!("sandbase-test-channel-{}", Uuid::new_v4().simple()));
            std::fs::create_dir_all(&directory).expect("create the test channel's directory");
            let write = |name: &str, text: &str| {
                let path = directory.join(name);
                std::fs::write(&path, text).expect("write the test channel's files");
                path
            };
            sandbase_egress::channel::ChannelFiles {
                ca_file: write("ca.pem", &ca),
                cert_file: write("cert.pem", &certificate),
                key_file: write("key.pem", &key),
                peer_name: None,
            }
        })
        .clone()
}

/// The test channel, loaded.
pub fn channel() -> sandbase_egress::channel::ChannelTls {
    channel_files()
        .load()
        .expect("load the test channel's certificates")
}

/// The operator token of test gateways.
pub const OPERATOR_TOKEN: &str = "test-operator-token-0123456789";

pub fn redis_url() -> String {
    std::env::var("SANDBASE_TEST_REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned())
}

/// Creates an empty database and returns its URL.
pub async fn fresh_database() -> String {
    let base = std::env::var("SANDBASE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let options =
        PgConnectOptions::from_str(&base).expect("SANDBASE_TEST_DATABASE_URL is a PostgreSQL URL");
    let name = format!("sandbase_test_{}", Uuid::new_v4().simple());
    let mut connection = options
        .connect()
        .await
        .expect("connect to PostgreSQL (run scripts/setup, or set SANDBASE_TEST_DATABASE_URL)");
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut connection)
        .await
        .expect("create a test database");
    connection.close().await.ok();
    options.database(&name).to_url_lossy().to_string()
}

/// Settings for a test gateway: its own database and Redis prefix, port 0, a random
/// session secret, and a rate limit high enough not to interfere.
pub async fn settings() -> Settings {
    let mut settings = Settings::default();
    settings.server.listen = "127.0.0.1:0".parse().expect("literal address");
    settings.server.shutdown_grace_secs = 5;
    settings.server.drain_secs = 0;
    settings.database.url = Some(SecretString::from(fresh_database().await));
    settings.database.max_connections = 10;
    settings.redis.url = Some(SecretString::from(redis_url()));
    settings.redis.key_prefix = format!("sandbase-test:{}:", Uuid::new_v4().simple());
    settings.auth.jwt_secret = Some(SecretString::from(format!(
        "{}{}",
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple()
    )));
    settings.server.internal_listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    settings.internal_tls = Some(channel_files());
    settings.auth.operator_token = Some(SecretString::from(OPERATOR_TOKEN));
    settings.rate_limit.per_second = 10_000;
    settings.rate_limit.burst = 10_000;
    settings.rate_limit.team_per_second = 10_000;
    settings.rate_limit.team_burst = 10_000;
    // Every test signs up from 127.0.0.1; the abuse tests set the real limits.
    settings.auth.signups_per_hour = 1_000_000;
    settings.auth.logins_per_minute = 1_000_000;
    // Likewise every request (many failing on purpose) and every connection.
    settings.server.requests_per_ip_per_second = 0;
    settings.auth.failed_auth_per_minute = 0;
    settings.server.max_connections_per_ip = 0;
    settings
}

/// What a test reads of a running gateway that HTTP does not show.
#[derive(Clone)]
pub struct Inspector(AppState);

impl Inspector {
    pub fn new(application: &Application) -> Inspector {
        Inspector(application.state().clone())
    }

    /// How many API keys the key cache has read from PostgreSQL.
    pub fn key_lookups(&self) -> u64 {
        self.0.auth.keys.lookups()
    }

    /// Whether the key cache is subscribed to revocations (and so answers from memory).
    pub fn key_cache_is_live(&self) -> bool {
        self.0.auth.keys.is_live()
    }

    /// What placement believes of a live worker: (capacity, running, memory MiB, CPU
    /// millicores), as its last heartbeat was held to.
    pub async fn worker_claims(&self, id: &str) -> anyhow::Result<Option<(u32, u32, u64, u64)>> {
        let live = self.0.sandboxes.workers.live().await?;
        Ok(live.iter().find(|worker| worker.id == id).map(|worker| {
            (
                worker.capacity,
                worker.running,
                worker.memory_mb,
                worker.cpu_millis,
            )
        }))
    }

    /// How many live workers could host a sandbox of `template` for `team_id` with
    /// `isolation` (the placement the scale benchmark times).
    pub async fn placement_candidates(
        &self,
        template: &str,
        isolation: sandbase_api::sandboxes::Isolation,
        team_id: Uuid,
    ) -> anyhow::Result<usize> {
        let placement = crate::workers::registry::Placement {
            template,
            mounts: &[],
            isolation,
            team_id,
        };
        let candidates = self.0.sandboxes.workers.candidates(&placement).await?;
        Ok(candidates.len())
    }
}

/// What the benchmarks time of the gateway's parts below its API: credit admission and the
/// usage samples' INSERT. Not a surface to build on.
pub mod internals {
    pub use crate::credits::{Admission, Admitted};
    pub use crate::usage::ingest::insert_samples;
}
