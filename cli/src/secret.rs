//! `sandbase secret`: credentials in the vault. Values are read from standard input (or a
//! hidden prompt), never from the command line, where other users and shell history see them.

use std::io::{IsTerminal, Read};

use anyhow::Context;
use reqwest::Method;
use sandbase_api::secrets::{
    BasicAuth, CreateSecretRequest, Injection, Placeholder, PlaceholderOptions, Secret, SecretList,
    UpdateSecretRequest, UsableBy,
};

use crate::args::GlobalArgs;
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
    /// Also swap the placeholder in request bodies (for the `--path`s).
    #[arg(long, requires = "placeholder")]
    in_body: bool,
    /// Also swap the placeholder in request paths and queries (for the `--path`s).
    #[arg(long, requires = "placeholder")]
    in_url: bool,
    /// A request path the body and URL swaps apply to: exact, or a prefix ending in `*`
    /// (repeatable).
    #[arg(long = "path")]
    paths: Vec<String>,
    /// A request header the placeholder is swapped in (repeatable; default: the usual
    /// credential headers, `authorization`, `x-api-key` and the like).
    #[arg(long = "placeholder-header", requires = "placeholder")]
    placeholder_headers: Vec<String>,
    /// Who may attach it to sandboxes and runs: `admin` (default) or `member`.
    #[arg(long, value_parser = parse_usable_by)]
    usable_by: Option<UsableBy>,
}

fn parse_usable_by(text: &str) -> Result<UsableBy, String> {
    UsableBy::parse(text).ok_or_else(|| "`admin` or `member`".to_owned())
}

impl SetArgs {
    fn placeholder(&self) -> Option<Placeholder> {
        let env = self.placeholder.clone()?;
        if !self.in_body
            && !self.in_url
            && self.paths.is_empty()
            && self.placeholder_headers.is_empty()
        {
            return Some(Placeholder::Env(env));
        }
        Some(Placeholder::Options(PlaceholderOptions {
            env,
            in_body: self.in_body,
            in_url: self.in_url,
            paths: self.paths.clone(),
            headers: self.placeholder_headers.clone(),
        }))
    }
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
                placeholder: args.placeholder(),
                header: args.header,
                format: args.format,
                basic: args.basic_user.map(|username| BasicAuth { username }),
                query: args.query,
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
                            usable_by: args.usable_by,
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
                            usable_by: args.usable_by.unwrap_or_default(),
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
                            secret.usable_by.as_str().to_owned(),
                            time(&secret.updated_at),
                        ]
                    })
                    .collect();
                table(
                    &["NAME", "VERSION", "HOSTS", "INJECT", "USABLE BY", "UPDATED"],
                    &rows,
                );
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
    } else if let Some(placeholder) = &inject.placeholder {
        let options = placeholder.options();
        let mut also: Vec<&str> = Vec::new();
        if options.in_body {
            also.push("body");
        }
        if options.in_url {
            also.push("url");
        }
        if also.is_empty() {
            format!("placeholder ${}", options.env)
        } else {
            format!(
                "placeholder ${} (+{} on {})",
                options.env,
                also.join("+"),
                options.paths.join(",")
            )
        }
    } else {
        String::new()
    }
}
