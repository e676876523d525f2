//! `sandbase vault`: the operator's key-encryption keys, their rotation, and the operator's
//! own secrets.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use uuid::Uuid;

use crate::serve::{load_operator_settings, runtime};
use crate::telemetry;

#[derive(Subcommand)]
pub enum VaultCommand {
    /// Print a new random key-encryption key entry (`VERSION:BASE64`) for vault.keys or
    /// the key file.
    NewKey {
        #[arg(long, default_value_t = 1)]
        version: i32,
    },
    /// Re-wrap every team's data key under the newest configured key-encryption key (keep
    /// the older key configured until this has finished; gateways keep working throughout).
    RotateKek {
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Replace a team's data key with a new one and re-encrypt its secrets under it (every
    /// team's, without `--team`): after a suspected leak of a data key or a database backup.
    RotateDataKeys {
        #[arg(long)]
        team: Option<Uuid>,
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// The operator's own credentials (the store's provider, paid API and MCP server keys),
    /// named by `credential_secret` in `[store]`; no team can read them.
    #[command(subcommand)]
    Secret(SecretCommand),
}

#[derive(Subcommand)]
pub enum SecretCommand {
    /// Store an operator secret, its value read from standard input (one trailing newline
    /// dropped); gateways read it when they start.
    Set {
        name: String,
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// The operator secrets' names and when each was set (never a value).
    Ls {
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Delete an operator secret.
    Rm {
        name: String,
        #[arg(long, env = "SANDBASE_CONFIG")]
        config: Option<PathBuf>,
    },
}

pub fn vault(command: VaultCommand) -> anyhow::Result<ExitCode> {
    match command {
        VaultCommand::NewKey { version } => {
            anyhow::ensure!(version > 0, "--version must be positive");
            println!("{}", sandbase_vault::Keyring::generate_entry(version));
        }
        VaultCommand::RotateKek { config } => {
            let (settings, keyring) = operator_keyring(config.as_deref())?;
            let current = keyring.current();
            let rewrapped = runtime()?.block_on(async move {
                let db = sandbase_gateway::connect_database(&settings).await?;
                let keys = sandbase_vault::rotate(&db, &keyring).await?;
                let secrets = sandbase_vault::reseal_operator_secrets(&db, &keyring).await?;
                Ok::<_, anyhow::Error>((keys, secrets))
            })?;
            println!(
                "re-wrapped {} data keys and re-sealed {} operator secrets under key version {current}",
                rewrapped.0, rewrapped.1
            );
        }
        VaultCommand::RotateDataKeys { team, config } => {
            let (settings, keyring) = operator_keyring(config.as_deref())?;
            let (teams, values) = runtime()?.block_on(async move {
                let db = sandbase_gateway::connect_database(&settings).await?;
                let teams: Vec<Uuid> = match team {
                    Some(team) => vec![team],
                    None => sandbase_vault::teams_with_data_keys(&db).await?,
                };
                let mut values = 0;
                for team in &teams {
                    values += sandbase_vault::rotate_data_key(&db, &keyring, *team).await?;
                }
                Ok::<_, anyhow::Error>((teams.len(), values))
            })?;
            println!("replaced {teams} data keys; {values} secret values re-encrypted");
        }
        VaultCommand::Secret(command) => secret(command)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The operator's settings and the vault's keyring they configure.
fn operator_keyring(
    config: Option<&std::path::Path>,
) -> anyhow::Result<(sandbase_gateway::Settings, sandbase_vault::Keyring)> {
    telemetry::init_client();
    let settings = load_operator_settings(config)?;
    let keyring = settings
        .vault
        .keyring()?
        .context("no vault keys configured (vault.keys or vault.key_file)")?;
    Ok((settings, keyring))
}

fn secret(command: SecretCommand) -> anyhow::Result<()> {
    let config = match &command {
        SecretCommand::Set { config, .. }
        | SecretCommand::Ls { config }
        | SecretCommand::Rm { config, .. } => config.clone(),
    };
    let (settings, keyring) = operator_keyring(config.as_deref())?;
    runtime()?.block_on(async move {
        let db = sandbase_gateway::connect_database(&settings).await?;
        match command {
            SecretCommand::Set { name, .. } => {
                anyhow::ensure!(
                    sandbase_gateway::operator::validate_secret_name(&name).is_ok(),
                    "NAME: 1 to 64 letters, digits, `_`, `.` or `-`, starting with a letter or digit"
                );
                let mut value = sandbase_vault::Zeroizing::new(Vec::new());
                std::io::stdin()
                    .take(64 * 1024 + 2)
                    .read_to_end(&mut value)
                    .context("reading the value from standard input")?;
                for ending in [b"\r\n".as_slice(), b"\n"] {
                    if value.ends_with(ending) {
                        let kept = value.len() - ending.len();
                        value.truncate(kept);
                        break;
                    }
                }
                anyhow::ensure!(!value.is_empty(), "the value (standard input) is empty");
                anyhow::ensure!(value.len() <= 64 * 1024, "the value is over 64 KiB");
                anyhow::ensure!(std::str::from_utf8(&value).is_ok(), "the value is not UTF-8");
                let mut connection = db.acquire().await?;
                let new =
                    sandbase_vault::set_operator_secret(&mut connection, &keyring, &name, &value)
                        .await?;
                let verb = if new { "stored" } else { "replaced" };
                println!("{verb} operator secret `{name}` (gateways read it when they start)");
            }
            SecretCommand::Ls { .. } => {
                for secret in sandbase_vault::operator_secrets(&db).await? {
                    println!(
                        "{}\tset {}\tkey version {}",
                        secret.name, secret.updated_at, secret.kek_version
                    );
                }
            }
            SecretCommand::Rm { name, .. } => {
                anyhow::ensure!(
                    sandbase_vault::remove_operator_secret(&db, &name).await?,
                    "no operator secret named `{name}`"
                );
                println!("deleted operator secret `{name}`");
            }
        }
        Ok(())
    })
}
