//! `sandbase run`: a command in a sandbox of its own, start to artifact, in one step.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use reqwest::Method;
use sandbase_api::sandboxes::ResourcesRequest;

use crate::args::GlobalArgs;
use crate::client::Client;
use crate::output::emit;
use crate::sandbox::{EgressArgs, parse_isolation, parse_pair};
use crate::transfer::{human_bytes, pack, unpack_response};

#[derive(Args)]
pub struct RunArgs {
    /// A directory whose content the command finds in /work/in (read-only).
    #[arg(long)]
    input: Option<PathBuf>,
    #[arg(long)]
    template: Option<String>,
    /// Isolation level: runc or gvisor (the server's default when absent).
    #[arg(long, value_parser = parse_isolation)]
    isolation: Option<sandbase_api::sandboxes::Isolation>,
    /// Kill the command after this many seconds.
    #[arg(long)]
    timeout: Option<u64>,
    /// KEY=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_pair)]
    env: Vec<(String, String)>,
    /// The directory in the sandbox kept as the artifact.
    #[arg(long, default_value = "/work/out")]
    outputs: String,
    /// Where the artifact is unpacked (default: ./run-<id>).
    #[arg(long)]
    download_to: Option<PathBuf>,
    #[command(flatten)]
    egress: EgressArgs,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `sandbase run`: submits a run, follows it, prints its output, downloads its artifact,
/// and exits with the command's exit code.
pub async fn run_once(global: &GlobalArgs, args: RunArgs) -> anyhow::Result<ExitCode> {
    use base64::Engine;
    use sandbase_api::runs::{CreateRunRequest, Run, RunInputs, RunState};

    let client = Client::new(global)?;
    client.require_token()?;
    let tar_base64 = match &args.input {
        Some(directory) => {
            anyhow::ensure!(
                directory.is_dir(),
                "{} is not a directory",
                directory.display()
            );
            Some(base64::engine::general_purpose::STANDARD.encode(pack(directory)?))
        }
        None => None,
    };
    let request = CreateRunRequest {
        template: args.template,
        cmd: Some(args.command),
        command: None,
        env: args.env.into_iter().collect(),
        inputs: RunInputs {
            files: BTreeMap::new(),
            tar_base64,
        },
        timeout_secs: args.timeout,
        resources: ResourcesRequest::default(),
        outputs: Some(args.outputs),
        egress: args.egress.policy(),
        credentials: args.egress.credentials.clone(),
        isolation: args.isolation,
        store: args.egress.store,
    };
    let mut run: Run = client.post("/v1/runs", &request).await?;
    eprintln!("run {} queued", run.id);
    let mut last = run.state;
    while matches!(run.state, RunState::Queued | RunState::Running) {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        run = client.get(&format!("/v1/runs/{}", run.id), &[]).await?;
        if run.state != last {
            eprintln!(
                "run {}: {}",
                run.id,
                serde_json::to_value(run.state)?.as_str().unwrap_or("")
            );
            last = run.state;
        }
    }
    emit(global.json, &run, |run| {
        print!("{}", run.stdout.as_deref().unwrap_or(""));
        eprint!("{}", run.stderr.as_deref().unwrap_or(""));
    })?;
    if run.state == RunState::Failed {
        bail!(
            "the run failed: {}",
            run.error.as_deref().unwrap_or("no reason given")
        );
    }
    if run.artifact_size.is_some() {
        let target = args
            .download_to
            .unwrap_or_else(|| PathBuf::from(format!("run-{}", run.id)));
        let response = client
            .stream(
                Method::GET,
                &format!("/v1/runs/{}/artifacts", run.id),
                &[],
                None,
                None,
            )
            .await?;
        let size = unpack_response(response, &target).await?;
        eprintln!(
            "artifact ({}, {} files) in {}",
            human_bytes(size.bytes),
            size.files,
            target.display()
        );
    }
    if run.timed_out {
        eprintln!("sandbase: the command timed out");
    }
    Ok(ExitCode::from(
        run.exit_code.unwrap_or(1).clamp(0, 255) as u8
    ))
}
