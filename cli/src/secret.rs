//! `sandbase secret`: credentials in the vault. Values are read from standard input (or a
//! hidden prompt), never from the command line, where other users and shell history see them.

use std::io::{IsTerminal, Read};

use anyhow::Context;
use reqwest::Method;
use sandbase_api::secrets::{
    BasicAuth, CreateSecretRequest, Injection, Secret, SecretList, UpdateSecretRequest,
};

use crate::GlobalArgs;
use crate::client::Client;
use crate::output::{emit, table, time};

#[derive(clap::Subcommand)]
pub enum SecretCommand {
    /// Store a credential (or a new version of it); the value comes from standard input.
    Set(SetArgs),
    /// List the team's credentials (never their values).
    Ls,
    /// Remove a credential and every version of its value.
    Rm { name: String },
}

#[derive(clap::Args)]
pub struct SetArgs {
    name: String,
    /// A host it is added to requests for: `api.github.com`, `*.example.org`, `host:8443`
    /// (repeatable).
    #[arg(long = "host", required = true)]
    hosts: Vec<String>,
    /// Set this header, e.g. `Authorization`.
    #[arg(long, group = "mode")]
    header: Option<String>,
    /// The header's value with `{value}` for the secret, e.g. `Bearer {value}`.
    #[arg(long, requires = "header")]
    format: Option<String>,
    /// HTTP basic authentication with this user name.
    #[arg(long = "basic-user", group = "mode")]
    basic_user: Option<String>,
    /// Set this query parameter.
    #[arg(long, group = "mode")]
    query: Option<String>,
    /// Give sandboxes this environment variable with a placeholder the proxy swaps out.
    #[arg(long, group = "mode")]
    placeholder: Option<String>,
}

fn read_value() -> anyhow::Result<String> {
    if std::io::stdin().is_terminal() {
        return rpassword::prompt_password("Value (hidden): ").context("reading the value");
    }
    let mut value = String::new();
    std::io::stdin()
        .read_to_string(&mut value)
        .context("reading the value from standard input")?;
    let trimmed = value.trim_end_matches(['\n', '\r']).len();
    value.truncate(trimmed);
    Ok(value)
}

pub async fn run(global: &GlobalArgs, command: SecretCommand) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    match command {
        SecretCommand::Set(args) => {
            let inject = Injection {
                header: args.header,
                format: args.format,
                basic: args.basic_user.map(|username| BasicAuth { username }),
                query: args.query,
                placeholder: args.placeholder,
            };
            let value = read_value()?;
            let existing: SecretList = client.get("/v1/secrets", &[]).await?;
            let secret: Secret = if existing.secrets.iter().any(|s| s.name == args.name) {
                client
                    .send(
                        Method::PUT,
                        &format!("/v1/secrets/{}", args.name),
                        &[],
                        Some(&UpdateSecretRequest {
                            value,
                            hosts: Some(args.hosts),
                            inject: Some(inject),
                        }),
                    )
                    .await?
            } else {
                client
                    .post(
                        "/v1/secrets",
                        &CreateSecretRequest {
                            name: args.name,
                            value,
                            hosts: args.hosts,
                            inject,
                        },
                    )
                    .await?
            };
            emit(global.json, &secret, |secret| {
                println!(
                    "Stored `{}` (version {}) for {}",
                    secret.name,
                    secret.version,
                    secret.hosts.join(", ")
                );
            })?;
        }
        SecretCommand::Ls => {
            let list: SecretList = client.get("/v1/secrets", &[]).await?;
            emit(global.json, &list, |_| {
                let rows: Vec<Vec<String>> = list
                    .secrets
                    .iter()
                    .map(|secret| {
                        vec![
                            secret.name.clone(),
                            secret.version.to_string(),
                            secret.hosts.join(","),
                            describe(&secret.inject),
                            time(&secret.updated_at),
                        ]
                    })
                    .collect();
                table(&["NAME", "VERSION", "HOSTS", "INJECT", "UPDATED"], &rows);
            })?;
        }
        SecretCommand::Rm { name } => {
            client.delete(&format!("/v1/secrets/{name}")).await?;
            if !global.json {
                println!("Removed `{name}`");
            }
        }
    }
    Ok(())
}

fn describe(inject: &Injection) -> String {
    if let Some(header) = &inject.header {
        format!(
            "header {header}: {}",
            inject.format.as_deref().unwrap_or("{value}")
        )
    } else if let Some(basic) = &inject.basic {
        format!("basic auth as {}", basic.username)
    } else if let Some(query) = &inject.query {
        format!("query ?{query}=")
    } else if let Some(name) = &inject.placeholder {
        format!("placeholder ${name}")
    } else {
        String::new()
    }
}
