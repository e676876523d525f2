//! `sandbase`: the server (`server`), the all-in-one single node (`dev`), operator
//! commands (`migrate`, `admin`) and the client verbs, which talk to `SANDBASE_URL`.

mod args;
mod billing;
mod client;
mod commands;
mod credentials;
mod dev_store;
mod egress_default;
mod mcp;
mod output;
mod preview;
mod replay;
mod run;
mod sandbox;
mod secret;
mod serve;
mod shell;
mod signal;
mod snapshot;
mod store;
mod telemetry;
mod template;
mod transfer;
mod vault;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::args::GlobalArgs;

#[derive(Parser)]
#[command(
    name = "sandbase",
    version,
    about = "SandBase: sandboxes, runs and credits for AI agents"
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (needs DATABASE_URL, REDIS_URL and auth.jwt_secret).
    Server(serve::ServerArgs),
    /// Run everything on this machine with local defaults, and print a ready-to-use API key.
    Dev(serve::DevArgs),
    /// Run sandboxes on this node for a gateway (needs containerd; see scripts/setup).
    Worker(worker::WorkerArgs),
    /// Apply database migrations and exit.
    Migrate {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Operator commands that act on the database directly.
    #[command(subcommand)]
    Admin(serve::AdminCommand),
    /// The vault's key-encryption keys: make one, rotate to the newest.
    #[command(subcommand)]
    Vault(vault::VaultCommand),
    /// The egress proxy process a worker starts and orders about (not for people).
    #[command(hide = true)]
    EgressProxy,
    /// Print the public API's OpenAPI document (what `/v1/openapi.json` serves).
    Openapi,
    /// Check a configuration as `server` would read it (with the environment's settings),
    /// naming the key at fault, without starting anything.
    CheckConfig {
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: PathBuf,
    },
    #[command(flatten)]
    Client(ClientCommand),
}

/// Verbs that talk to a gateway over HTTP.
#[derive(Subcommand)]
enum ClientCommand {
    /// Create an account (user, team, first API key) and save the key for the CLI.
    Signup(commands::SignupArgs),
    /// Log in and save a new API key for the CLI.
    Login(commands::LoginArgs),
    /// Show who the current credentials belong to.
    Whoami,
    /// Manage API keys.
    #[command(subcommand)]
    Keys(commands::KeysCommand),
    /// Manage team members.
    #[command(subcommand)]
    Members(commands::MembersCommand),
    /// Read the team's audit log.
    Audit(commands::AuditArgs),
    /// Show the team's credits and grants (`credits buy N` for a Stripe checkout link).
    Credits {
        #[command(subcommand)]
        command: Option<billing::CreditsCommand>,
    },
    /// What the team spent, grouped (a table and a chart).
    Usage(billing::UsageArgs),
    /// Create sandboxes, run commands in them, move files in and out.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCommand),
    /// Run one command in a fresh sandbox: inputs in, output and artifacts out.
    Run(run::RunArgs),
    /// Models through the gateway with one key: what is offered, and the team's calls.
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// SandBase's MCP server over stdio, for MCP clients that start local servers (the same
    /// tools as the gateway's `/mcp`, with this CLI's key).
    Mcp,
    /// Play a terminal session's recording (`sandbase sandbox shell` sessions are recorded).
    Replay(replay::ReplayArgs),
    /// Credentials for sandboxes' outbound requests: set (value from stdin), ls, rm.
    #[command(subcommand)]
    Secret(secret::SecretCommand),
    /// Templates: import, pull and remove (operator, node token), list.
    #[command(subcommand)]
    Template(template::TemplateCommand),
    /// The team's default egress policy for sandboxes and runs that give none: show, set,
    /// clear.
    EgressDefault {
        #[command(subcommand)]
        command: Option<egress_default::EgressDefaultCommand>,
    },
}

fn main() -> ExitCode {
    // reqwest is built without a default TLS provider; use ring (already in the tree).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Server(args) => serve::server(args),
        Command::Dev(args) => serve::dev(args),
        Command::Worker(args) => worker::run(args),
        Command::Migrate { database_url } => serve::migrate(database_url),
        Command::Admin(command) => serve::admin(command),
        Command::Vault(command) => vault::vault(command),
        Command::Openapi => serve::openapi(),
        Command::CheckConfig { config } => serve::check_config(&config),
        Command::EgressProxy => {
            telemetry::init_proxy();
            sandbase_egress::process::run()
                .map_err(|why| anyhow::anyhow!("egress proxy: {why}"))
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Client(command) => {
            telemetry::init_client();
            run_client(cli.global, command)
        }
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_client(global: GlobalArgs, command: ClientCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match command {
            ClientCommand::Sandbox(command) => return sandbox::run(&global, command).await,
            ClientCommand::Run(args) => return run::run_once(&global, args).await,
            ClientCommand::Template(command) => return template::run(&global, command).await,
            ClientCommand::Signup(args) => commands::signup(&global, args).await,
            ClientCommand::Login(args) => commands::login(&global, args).await,
            ClientCommand::Whoami => commands::whoami(&global).await,
            ClientCommand::Keys(command) => commands::keys(&global, command).await,
            ClientCommand::Members(command) => commands::members(&global, command).await,
            ClientCommand::Audit(args) => commands::audit(&global, args).await,
            ClientCommand::Credits { command } => billing::credits(&global, command).await,
            ClientCommand::Usage(args) => billing::usage(&global, args).await,
            ClientCommand::Replay(args) => replay::replay(&global, args).await,
            ClientCommand::Store(command) => store::run(&global, command).await,
            ClientCommand::Mcp => mcp::serve(&global).await,
            ClientCommand::Secret(command) => secret::run(&global, command).await,
            ClientCommand::EgressDefault { command } => egress_default::run(&global, command).await,
        }?;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand's arguments are consistent (no clashing names or ids).
    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
