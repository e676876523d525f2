//! `sandbase template …`: the operator's templates (import, pull and remove go to the
//! gateway's internal listener with the operator token) and the list every team sees.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use futures_util::StreamExt;
use reqwest::Method;
use sandbase_api::internal::paths;
use serde_json::{Value, json};

use crate::args::GlobalArgs;
use crate::client::Client;
use crate::output::{emit, table};
use crate::transfer::human_bytes;

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Import an image archive (OCI layout or `docker save` output) as a template on every worker.
    Import {
        archive: PathBuf,
        #[arg(long)]
        name: String,
        /// The archive is a plain root file system tarball, not an image.
        #[arg(long)]
        rootfs: bool,
        #[command(flatten)]
        operator: OperatorArgs,
    },
    /// Pull an image from a registry (`host/name:tag`) into a template on every worker.
    Pull {
        reference: String,
        /// Template name (default: the image's last path segment).
        #[arg(long)]
        name: Option<String>,
        /// A registry reached over plain HTTP (loopback registries always are).
        #[arg(long = "insecure-registry")]
        insecure_registries: Vec<String>,
        #[command(flatten)]
        operator: OperatorArgs,
    },
    /// List the templates on the live workers.
    Ls,
    /// Remove a template from every worker.
    Rm {
        name: String,
        #[command(flatten)]
        operator: OperatorArgs,
    },
}

#[derive(clap::Args)]
pub struct OperatorArgs {
    /// The deployment's operator token (the gateway's `auth.operator_token`).
    #[arg(long, env = "SANDBASE_OPERATOR_TOKEN", hide_env_values = true)]
    operator_token: String,
    /// The gateway's internal listener (`server.internal_listen`), where template
    /// operations are served.
    #[arg(
        long,
        env = "SANDBASE_INTERNAL_URL",
        default_value = "http://127.0.0.1:8081"
    )]
    internal_url: String,
    /// The internal channel's CA (PEM), when the internal listener speaks TLS.
    #[arg(long, env = "SANDBASE_INTERNAL_CA")]
    internal_ca: Option<std::path::PathBuf>,
}

impl OperatorArgs {
    /// The internal listener's URL, the operator token and the CA to trust there.
    fn credentials(&self) -> (&str, &str, Option<&std::path::Path>) {
        (
            &self.internal_url,
            &self.operator_token,
            self.internal_ca.as_deref(),
        )
    }
}

fn print_templates(list: &Value) {
    let rows: Vec<Vec<String>> = list["templates"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|template| {
            vec![
                template["name"].as_str().unwrap_or_default().to_owned(),
                template["workers"].to_string(),
                template["warm"].to_string(),
            ]
        })
        .collect();
    table(&["NAME", "WORKERS", "WARM"], &rows);
}

pub async fn run(global: &GlobalArgs, command: TemplateCommand) -> anyhow::Result<ExitCode> {
    let client = Client::new(global)?;
    match command {
        TemplateCommand::Ls => {
            client.require_token()?;
            let list: Value = client.get("/v1/templates", &[]).await?;
            emit(global.json, &list, print_templates)?;
            Ok(ExitCode::SUCCESS)
        }
        TemplateCommand::Import {
            archive,
            name,
            rootfs,
            operator,
        } => import(&client, &archive, &name, rootfs, &operator).await,
        TemplateCommand::Pull {
            reference,
            name,
            insecure_registries,
            operator,
        } => {
            let name = match name {
                Some(name) => name,
                None => default_name(&reference)?,
            };
            let body =
                json!({ "reference": reference, "insecure_registries": insecure_registries });
            let response = client
                .operator(
                    Method::POST,
                    &paths::template_pull(&name),
                    operator.credentials(),
                    "application/json",
                    serde_json::to_vec(&body)?.into(),
                )
                .await?;
            follow(response).await
        }
        TemplateCommand::Rm { name, operator } => {
            let response = client
                .operator(
                    Method::DELETE,
                    &paths::template(&name),
                    operator.credentials(),
                    "application/json",
                    reqwest::Body::from(Vec::new()),
                )
                .await?;
            follow(response).await
        }
    }
}

/// `registry/tools/python:3.12` → `python`.
fn default_name(reference: &str) -> anyhow::Result<String> {
    let path = reference.split(['@']).next().unwrap_or(reference);
    let last = path.rsplit('/').next().unwrap_or(path);
    let name = last.split(':').next().unwrap_or(last).to_ascii_lowercase();
    anyhow::ensure!(!name.is_empty(), "give the template a --name");
    Ok(name)
}

fn bar(label: &str, done: u64, total: u64) -> String {
    let width = 30;
    let filled = if total == 0 {
        width
    } else {
        ((done as f64 / total as f64) * width as f64) as usize
    };
    format!(
        "{label} [{}{}] {} / {}",
        "#".repeat(filled.min(width)),
        "-".repeat(width - filled.min(width)),
        human_bytes(done),
        human_bytes(total)
    )
}

/// Prints one worker's line; true when it reports an error.
fn report(line: &Value) -> bool {
    let worker = line["worker"].as_str().unwrap_or("?");
    if let Some(error) = line.get("error") {
        eprintln!(
            "{worker}: failed: {} ({})",
            error["message"].as_str().unwrap_or_default(),
            error["code"].as_str().unwrap_or_default()
        );
        return true;
    }
    let mut err = std::io::stderr().lock();
    let terminal = std::io::stderr().is_terminal();
    if line["done"] == true {
        let _ = writeln!(err, "{worker}: done");
    } else if let (Some(layer), Some(bytes)) = (line["layer"].as_u64(), line["bytes"].as_u64()) {
        // A layer downloading: one bar, redrawn in place on a terminal.
        let label = format!(
            "{worker}: layer {layer}/{}",
            line["layers"].as_u64().unwrap_or(0)
        );
        let total = line["total"].as_u64().unwrap_or(0);
        if terminal {
            let _ = write!(err, "\r{}", bar(&label, bytes, total));
        } else if bytes == total {
            let _ = writeln!(err, "{}", bar(&label, bytes, total));
        }
    } else if let Some(progress) = line["progress"].as_str() {
        if terminal {
            let _ = writeln!(err);
        }
        let _ = writeln!(err, "{worker}: {progress}");
    }
    false
}

/// Follows an NDJSON progress answer; fails when any worker failed or none answered.
async fn follow(response: reqwest::Response) -> anyhow::Result<ExitCode> {
    let mut pending = Vec::new();
    let (mut failed, mut done) = (false, 0);
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        pending.extend_from_slice(&chunk.context("reading the progress")?);
        while let Some(end) = pending.iter().position(|byte| *byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line: Value = serde_json::from_slice(&line)?;
            failed |= report(&line);
            if line["done"] == true {
                done += 1;
            }
        }
    }
    anyhow::ensure!(done > 0 || failed, "no worker is connected to the gateway");
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Uploads an image archive (or a root file system tarball) as template `name`, showing the
/// upload's progress and then every worker's.
async fn import(
    client: &Client,
    archive: &std::path::Path,
    name: &str,
    rootfs: bool,
    operator: &OperatorArgs,
) -> anyhow::Result<ExitCode> {
    let file = tokio::fs::File::open(&archive)
        .await
        .with_context(|| format!("opening {}", archive.display()))?;
    let total = file.metadata().await?.len();
    let progress = std::io::stderr().is_terminal();
    let mut sent = 0u64;
    let chunks = futures_util::stream::unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt;
        let mut buffer = vec![0u8; 1024 * 1024];
        match file.read(&mut buffer).await {
            Ok(0) => None,
            Ok(read) => {
                buffer.truncate(read);
                Some((Ok::<_, std::io::Error>(buffer), file))
            }
            Err(error) => Some((Err(error), file)),
        }
    })
    .map(move |chunk| {
        if let Ok(bytes) = &chunk {
            sent += bytes.len() as u64;
            if progress {
                eprint!("\r{}", bar("uploading", sent, total));
            }
        }
        chunk
    });
    let format = if rootfs { "rootfs" } else { "image" };
    let response = client
        .operator(
            Method::PUT,
            &format!("{}?format={format}", paths::template(name)),
            operator.credentials(),
            "application/x-tar",
            reqwest::Body::wrap_stream(chunks),
        )
        .await?;
    if progress {
        eprintln!();
    }
    eprintln!("uploaded {} ({})", archive.display(), human_bytes(total));
    follow(response).await
}
