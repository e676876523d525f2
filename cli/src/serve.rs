//! `server`, `dev`, `migrate` and `admin`: the commands that run or operate a gateway.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use rand::Rng;
use rand::distr::Alphanumeric;
use sandbase_gateway::{Application, Settings, operator};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{credentials, telemetry};

#[derive(Args)]
pub struct ServerArgs {
    /// Address to listen on (overrides server.listen).
    #[arg(long, value_parser = crate::args::parse_listen)]
    listen: Option<SocketAddr>,
    /// TOML configuration file (see sandbase.example.toml).
    #[arg(long, env = "SANDBASE_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Args)]
pub struct DevArgs {
    /// Address to listen on.
    #[arg(long, value_parser = crate::args::parse_listen, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// TOML configuration file, layered over the dev defaults.
    #[arg(long, env = "SANDBASE_CONFIG")]
    config: Option<PathBuf>,
    /// Where dev mode keeps its session secret and bootstrap credentials.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Run only the gateway, without a worker on this machine.
    #[arg(long)]
    no_worker: bool,
    #[command(flatten)]
    node: crate::worker::NodeArgs,
}

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Grant credits to a team (booked in the ledger; repeat-safe with --key).
    Grant {
        #[arg(long)]
        team: Uuid,
        /// Credits, e.g. 25 or 2.5.
        #[arg(long)]
        credits: String,
        /// Days until they expire (default: never).
        #[arg(long)]
        expires_in_days: Option<u32>,
        /// Lower is used first (starter credits are 0).
        #[arg(long, default_value_t = 10)]
        priority: i32,
        /// Why (kept in the ledger).
        #[arg(long, default_value = "admin grant")]
        note: String,
        /// Idempotency key: the same key grants once (default: a new one).
        #[arg(long)]
        key: Option<String>,
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Print the credential of worker `--worker-id`, derived from `workers.node_token`: give
    /// it to that worker alone (`sandbase worker --credential`).
    WorkerCredential {
        #[arg(long)]
        worker_id: String,
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Recompute every balance from the ledger's entries and compare (exit 1 on a mismatch).
    Reconcile {
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Set how many sandboxes a team may have at once (or `--clear` it back to
    /// `sandboxes.max_per_team`).
    SandboxQuota {
        #[arg(long)]
        team: Uuid,
        #[arg(long, required_unless_present = "clear")]
        max: Option<u32>,
        #[arg(long, conflicts_with = "max")]
        clear: bool,
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Set a team's request rate limit (or `--clear` it back to the default).
    RateLimit {
        #[arg(long)]
        team: Uuid,
        #[arg(long, required_unless_present = "clear")]
        per_second: Option<u32>,
        #[arg(long)]
        burst: Option<u32>,
        #[arg(long, conflicts_with_all = ["per_second", "burst"])]
        clear: bool,
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
}

/// The dev-mode defaults: everything on this machine.
pub const DEV_DATABASE_URL: &str = "postgres://sandbase:sandbase@127.0.0.1:5432/sandbase";
pub const DEV_REDIS_URL: &str = "redis://127.0.0.1:6379";
const DEV_EMAIL: &str = "dev@sandbase.local";

pub fn server(args: ServerArgs) -> anyhow::Result<ExitCode> {
    let mut settings = Settings::load(args.config.as_deref())?;
    if let Some(listen) = args.listen {
        settings.server.listen = listen;
    }
    let _telemetry = telemetry::init(&settings.telemetry)?;
    let (_, provider_keys) = crate::dev_store::from_env(|name| std::env::var(name).ok());
    runtime()?.block_on(async move {
        crate::dev_store::seal(&settings, &provider_keys).await?;
        let application = Application::build(settings).await?;
        tracing::info!(
            address = %application.local_addr(),
            internal = %application.internal_addr(),
            "gateway listening"
        );
        application
            .run_until_stopped(crate::signal::shutdown_signal())
            .await
    })?;
    Ok(ExitCode::SUCCESS)
}

pub fn dev(args: DevArgs) -> anyhow::Result<ExitCode> {
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(crate::args::default_state_dir);
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating the state directory {}", state_dir.display()))?;
    let mut state = DevState::load_or_create(&state_dir)?;

    let defaults = dev_defaults(&args, &state, &state_dir)?;
    let mut settings = Settings::load_with_defaults(defaults, args.config.as_deref())?;
    settings.server.listen = args.listen;
    let _telemetry = telemetry::init(&settings.telemetry)?;
    let node_token = settings
        .workers
        .node_token
        .as_ref()
        .map(|token| secrecy::ExposeSecret::expose_secret(token).to_owned())
        .context("workers.node_token is missing")?;

    let models = settings.store.models.len();
    let dashboard = settings.server.web_dir.is_some();
    let (_, provider_keys) = crate::dev_store::from_env(|name| std::env::var(name).ok());
    runtime()?.block_on(async move {
        crate::dev_store::seal(&settings, &provider_keys).await?;
        let application = Application::build(settings).await?;
        let address = application.local_addr();
        let internal = format!("https://{}", application.internal_addr());
        let api_key = operator::ensure_dev_account(&application, state.account()).await?;
        state.api_key = Some(api_key.clone());
        state.save(&state_dir)?;
        let url = format!("http://{address}");
        let (stop_gateway, gateway_stopped) = tokio::sync::oneshot::channel::<()>();
        let gateway = tokio::spawn(application.run_until_stopped(async move {
            let _ = gateway_stopped.await;
        }));
        let worker = if args.no_worker {
            None
        } else {
            let worker_id = args.node.id_for("");
            let credential = operator::worker_credential(
                &SecretString::from(node_token.clone()),
                &worker_id,
            );
            let mut config = args.node.service_config(&internal, &credential)?;
            config.tls = Some(
                dev_channel(&state_dir)?
                    .load()
                    .map_err(|error| anyhow::anyhow!("the dev channel's TLS: {error}"))?,
            );
            println!(
                "  starting the worker (templates are built on first start; `base` takes a minute)"
            );
            Some(sandbase_worker::service::start(config).await?)
        };
        let saved = save_for_the_cli(&url, &api_key).await?;
        println!();
        println!("  SandBase dev server is running");
        println!();
        println!("  API        {url}");
        println!("  API key    {api_key}");
        if dashboard {
            println!("  Dashboard  {url}/  (log in as below)");
        } else {
            println!("  Dashboard  not built (scripts/dev builds web/ and serves it here)");
        }
        println!("  Login      {} / {}", state.email, state.password);
        println!("  OpenAPI    {url}/v1/openapi.json");
        println!("  Models     {}", models_line(&models, &url));
        println!("  Internal   {internal} (workers, templates, /metrics)");
        println!();
        println!("  export SANDBASE_URL={url} SANDBASE_API_KEY={api_key}");
        println!(
            "  operator:  export SANDBASE_INTERNAL_URL={internal} SANDBASE_INTERNAL_CA={} SANDBASE_OPERATOR_TOKEN={}",
            dev_channel(&state_dir)?.ca_file.display(),
            state.operator_token
        );
        if saved {
            println!("  (saved for the CLI: `sandbase whoami` works as is)");
        }
        println!();
        if let Some(running) = &worker {
            println!(
                "  Worker     {} (containerd namespace `{}`)",
                running.local_addr(),
                args.node.namespace
            );
            println!();
        }
        crate::signal::shutdown_signal().await;
        if let Some(running) = worker {
            running.stop().await;
        }
        let _ = stop_gateway.send(());
        gateway.await.context("the gateway task failed")?
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Loads and validates `config` as `server` would (the internal channel's certificate and
/// key read and matched too), and says so.
pub fn check_config(config: &Path) -> anyhow::Result<ExitCode> {
    let settings = Settings::load_with_defaults(Settings::default(), Some(config))?;
    if let Some(files) = &settings.internal_tls {
        files
            .load()
            .map_err(|error| anyhow::anyhow!("internal_tls: {error}"))?;
    }
    println!("{}: valid", config.display());
    Ok(ExitCode::SUCCESS)
}

/// Prints the OpenAPI document, as the gateway renders it, without starting one.
pub fn openapi() -> anyhow::Result<ExitCode> {
    let document = sandbase_gateway::openapi_document(&Settings::default())?;
    println!("{}", serde_json::to_string_pretty(&document)?);
    Ok(ExitCode::SUCCESS)
}

/// The dev server's settings before its configuration file and environment: everything on
/// this machine, secrets from the state directory.
fn dev_defaults(args: &DevArgs, state: &DevState, state_dir: &Path) -> anyhow::Result<Settings> {
    let mut defaults = Settings::default();
    defaults.server.listen = args.listen;
    // One machine, no load balancer to drain from.
    defaults.server.drain_secs = 0;
    defaults.database.url = Some(SecretString::from(DEV_DATABASE_URL));
    defaults.redis.url = Some(SecretString::from(DEV_REDIS_URL));
    defaults.auth.jwt_secret = Some(SecretString::from(state.jwt_secret.clone()));
    defaults.workers.node_token = Some(SecretString::from(state.node_token.clone()));
    defaults.auth.operator_token = Some(SecretString::from(state.operator_token.clone()));
    defaults.internal_tls = Some(dev_channel(state_dir)?);
    defaults.vault.keys = vec![SecretString::from(state.vault_key.clone())];
    // Browsers resolve every *.localhost name to loopback: previews need no DNS set-up.
    defaults.previews.domain = Some("preview.localhost".to_owned());
    defaults.previews.scheme = "http".to_owned();
    defaults.previews.port = Some(args.listen.port());
    // The store's providers from the keys in the environment (stored in the vault by `dev`).
    defaults.store = crate::dev_store::from_env(|name| std::env::var(name).ok()).0;
    // Checkout returns to the dashboard, which follows the balance until the credits arrive.
    defaults.stripe.success_url = format!("http://{}/billing/success", args.listen);
    defaults.stripe.cancel_url = format!("http://{}/billing/cancel", args.listen);
    // The dashboard, when it has been built (scripts/dev builds it).
    defaults.server.web_dir = Some(PathBuf::from("web/dist"))
        .filter(|dist| dist.join("index.html").is_file())
        .and_then(|dist| std::path::absolute(dist).ok());
    Ok(defaults)
}

pub fn migrate(database_url: String) -> anyhow::Result<ExitCode> {
    telemetry::init_client();
    runtime()?.block_on(async move {
        let mut settings = Settings::default();
        settings.database.url = Some(SecretString::from(database_url));
        settings.database.max_connections = 1;
        let db = sandbase_gateway::connect_database(&settings).await?;
        sandbase_gateway::migrate(&db).await?;
        println!("migrations applied");
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Prints the credential of `worker_id`, derived from the configured node secret.
fn print_worker_credential(worker_id: &str, config: Option<&Path>) -> anyhow::Result<()> {
    let mut defaults = Settings::default();
    // Placeholders that only satisfy validation: this reads the node secret and nothing else.
    defaults.auth.jwt_secret = Some(SecretString::from("x".repeat(32)));
    defaults.database.url = Some(SecretString::from("postgres://unused"));
    defaults.redis.url = Some(SecretString::from("redis://unused"));
    let settings = Settings::load_with_defaults(defaults, config)?;
    let secret = settings
        .workers
        .node_token
        .context("workers.node_token is not configured")?;
    anyhow::ensure!(
        !worker_id.is_empty() && worker_id.len() <= 200,
        "--worker-id must be 1 to 200 characters"
    );
    println!("{}", operator::worker_credential(&secret, worker_id));
    Ok(())
}

pub fn admin(command: AdminCommand) -> anyhow::Result<ExitCode> {
    telemetry::init_client();
    match command {
        AdminCommand::Grant {
            team,
            credits,
            expires_in_days,
            priority,
            note,
            key,
            config,
        } => {
            let settings = load_operator_settings(config.as_deref())?;
            let amount = sandbase_billing::Credits::parse(&credits)
                .filter(|amount| amount.0 > 0)
                .context("--credits must be a positive amount with at most 6 decimals")?;
            let granted = runtime()?.block_on(async move {
                let db = sandbase_gateway::connect_database(&settings).await?;
                let mut transaction = db.begin().await?;
                let granted = sandbase_billing::grant(
                    &mut transaction,
                    sandbase_billing::NewGrant {
                        team_id: team,
                        source: sandbase_billing::GrantSource::Admin,
                        amount,
                        priority,
                        effective_at: None,
                        expires_at: expires_in_days.map(|days| {
                            chrono::Utc::now() + chrono::Duration::days(i64::from(days))
                        }),
                        idempotency_key: key.unwrap_or_else(|| format!("admin:{}", Uuid::now_v7())),
                        description: note,
                        details: serde_json::json!({ "by": "sandbase admin grant" }),
                    },
                )
                .await
                .context("booking the grant (does the team exist?)")?;
                transaction.commit().await?;
                Ok::<_, anyhow::Error>(granted)
            })?;
            match granted {
                Some(grant) => println!("granted {amount} credits to team {team} (grant {grant})"),
                None => println!("already granted with this key: nothing changed"),
            }
        }
        AdminCommand::WorkerCredential { worker_id, config } => {
            print_worker_credential(&worker_id, config.as_deref())?;
        }
        AdminCommand::Reconcile { config } => {
            let settings = load_operator_settings(config.as_deref())?;
            let mismatches = runtime()?.block_on(async move {
                let db = sandbase_gateway::connect_database(&settings).await?;
                let mut connection = db.acquire().await?;
                Ok::<_, anyhow::Error>(sandbase_billing::reconcile(&mut connection).await?)
            })?;
            if mismatches.is_empty() {
                println!("the ledger balances and every grant matches its entries");
            } else {
                for mismatch in &mismatches {
                    println!("{}", serde_json::to_string(mismatch)?);
                }
                return Ok(ExitCode::FAILURE);
            }
        }
        AdminCommand::SandboxQuota {
            team,
            max,
            clear,
            config,
        } => {
            let settings = load_operator_settings(config.as_deref())?;
            let max = if clear { None } else { max };
            runtime()?.block_on(async move {
                let db = sandbase_gateway::connect_database(&settings).await?;
                operator::set_team_sandbox_quota(&db, team, max).await
            })?;
            match max {
                Some(max) => println!("team {team}: at most {max} sandboxes at once"),
                None => println!("team {team}: the deployment's sandbox quota"),
            }
        }
        AdminCommand::RateLimit {
            team,
            per_second,
            burst,
            clear,
            config,
        } => set_rate_limit(team, per_second, burst, clear, config.as_deref())?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `sandbase admin rate-limit`.
fn set_rate_limit(
    team: Uuid,
    per_second: Option<u32>,
    burst: Option<u32>,
    clear: bool,
    config: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let settings = load_operator_settings(config)?;
    let limit = if clear {
        None
    } else {
        let per_second = per_second.context("--per-second is required")?;
        anyhow::ensure!(per_second > 0, "--per-second must be at least 1");
        let burst = burst.unwrap_or(per_second);
        anyhow::ensure!(burst > 0, "--burst must be at least 1");
        Some((per_second, burst))
    };
    runtime()?.block_on(async move {
        let db = sandbase_gateway::connect_database(&settings).await?;
        let redis = sandbase_gateway::connect_redis(&settings).await?;
        operator::set_team_rate_limit(&db, redis, &settings.redis.key_prefix, team, limit).await
    })?;
    match limit {
        Some((per_second, burst)) => {
            println!("team {team}: {per_second} requests/s, burst {burst}")
        }
        None => println!("team {team}: default rate limit"),
    }
    Ok(())
}

/// Operator commands need the database and Redis, not the session secret.
pub(crate) fn load_operator_settings(config: Option<&Path>) -> anyhow::Result<Settings> {
    let mut defaults = Settings::default();
    // A placeholder that only satisfies validation: operator commands sign nothing.
    defaults.auth.jwt_secret = Some(SecretString::from("x".repeat(32)));
    Ok(Settings::load_with_defaults(defaults, config)?)
}

/// The dev server's internal channel: a CA and a certificate for this machine's loopback,
/// generated on the first start and kept in the state directory (the key readable by its
/// owner only).
fn dev_channel(state_dir: &Path) -> anyhow::Result<sandbase_egress::channel::ChannelFiles> {
    let files = sandbase_egress::channel::ChannelFiles {
        ca_file: state_dir.join("channel-ca.pem"),
        cert_file: state_dir.join("channel-cert.pem"),
        key_file: state_dir.join("channel-key.pem"),
        peer_name: None,
    };
    if !files.key_file.exists() {
        let (ca, certificate, key) =
            sandbase_egress::channel::generate(&["127.0.0.1", "localhost", "::1"])
                .map_err(|error| anyhow::anyhow!("generating the dev channel's TLS: {error}"))?;
        std::fs::write(&files.ca_file, ca)?;
        std::fs::write(&files.cert_file, certificate)?;
        credentials::write_private(&files.key_file, key.as_bytes())?;
    }
    Ok(files)
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// What dev mode remembers between starts.
#[derive(Serialize, Deserialize)]
struct DevState {
    jwt_secret: String,
    email: String,
    password: String,
    #[serde(default)]
    api_key: Option<String>,
    /// Shared by the dev gateway and its worker.
    #[serde(default = "new_node_token")]
    node_token: String,
    /// The dev operator's token (admin routes, template operations).
    #[serde(default = "new_node_token")]
    operator_token: String,
    /// The dev vault's key-encryption key.
    #[serde(default = "new_vault_key")]
    vault_key: String,
}

fn new_vault_key() -> String {
    sandbase_vault::Keyring::generate_entry(1)
}

fn new_node_token() -> String {
    random_string(40)
}

impl DevState {
    const FILE: &'static str = "dev.json";

    fn load_or_create(dir: &Path) -> anyhow::Result<DevState> {
        let path = dir.join(Self::FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("reading {} (delete it to start over)", path.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(DevState {
                jwt_secret: random_string(48),
                email: DEV_EMAIL.to_owned(),
                password: random_string(20),
                api_key: None,
                node_token: new_node_token(),
                operator_token: new_node_token(),
                vault_key: new_vault_key(),
            }),
            Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// The dev account as the gateway makes sure of it.
    fn account(&self) -> operator::DevAccount<'_> {
        operator::DevAccount {
            email: &self.email,
            password: &self.password,
            saved_key: self.api_key.as_deref(),
        }
    }

    fn save(&self, dir: &Path) -> anyhow::Result<()> {
        credentials::write_private(&dir.join(Self::FILE), &serde_json::to_vec_pretty(self)?)
    }
}

fn random_string(length: usize) -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(length)
        .map(char::from)
        .collect()
}

/// Saves the dev key for the CLI unless the saved one is for this server and still works: a
/// key saved for another URL, or one this server no longer knows (a fresh dev state), would
/// leave `sandbase whoami` failing.
async fn save_for_the_cli(url: &str, api_key: &str) -> anyhow::Result<bool> {
    if let Some(saved) = credentials::load()?
        && saved.url == url
        && (saved.api_key == api_key || key_works(url, &saved.api_key).await)
    {
        return Ok(false);
    }
    credentials::save(url, api_key)?;
    Ok(true)
}

/// Whether `api_key` authenticates at `url` (a network failure counts as working: nothing
/// is overwritten on a guess).
async fn key_works(url: &str, api_key: &str) -> bool {
    let answer = reqwest::Client::new()
        .get(format!("{url}/v1/me"))
        .bearer_auth(api_key)
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await;
    !matches!(answer, Ok(response) if response.status() == reqwest::StatusCode::UNAUTHORIZED)
}

/// What `sandbase dev` says about the store: how to use its models, or how to get some.
fn models_line(models: &usize, url: &str) -> String {
    if *models == 0 {
        return "none: start with OPENAI_API_KEY or ANTHROPIC_API_KEY set to offer models with your SandBase key".to_owned();
    }
    format!(
        "{models} (sandbase store models); OPENAI_BASE_URL={url}/openai/v1 ANTHROPIC_BASE_URL={url}/anthropic with the API key below"
    )
}
