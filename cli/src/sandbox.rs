//! `sandbase sandbox …`: create, inspect, run commands in, copy files to and from, export,
//! extend and destroy sandboxes.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use reqwest::Method;
use sandbase_api::sandboxes::{
    CreateSandboxRequest, ExecEvent, ExtendTimeoutRequest, ResourcesRequest, RunAs, Sandbox,
    SandboxList,
};
use serde_json::json;
use uuid::Uuid;

use crate::args::GlobalArgs;
use crate::client::Client;
use crate::output::{emit, optional_time, table, time};
use crate::transfer::{copy, download_archive, human_bytes};

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox and print its id.
    Create(CreateArgs),
    /// List the team's sandboxes.
    Ls {
        /// Only sandboxes in this state (creating, running, stopped).
        #[arg(long)]
        state: Option<String>,
    },
    /// Show one sandbox.
    Get { id: Uuid },
    /// Run a command, streaming its output; exits with the command's exit code.
    Exec(ExecArgs),
    /// Copy a file or directory between here and a sandbox: `ID:/path` on one side.
    Cp { source: String, destination: String },
    /// Download a directory of a sandbox (as an archive) and unpack it here.
    Export {
        id: Uuid,
        path: String,
        /// Directory to unpack into.
        #[arg(long, default_value = ".")]
        to: PathBuf,
        /// Destroy the sandbox once the export is written.
        #[arg(long)]
        destroy: bool,
    },
    /// Destroy a sandbox.
    Destroy { id: Uuid },
    /// Give a running sandbox SECONDS more to live (from now).
    Extend { id: Uuid, seconds: u64 },
    /// Freeze a sandbox: its processes keep their memory, use no CPU and cost memory only.
    Pause { id: Uuid },
    /// Thaw a paused sandbox: its processes go on where they were.
    Resume { id: Uuid },
    /// Snapshot a sandbox's /work and /tmp; prints the snapshot's id (start from it with
    /// `create --from-snapshot`).
    Snapshot { id: Uuid },
    /// List the team's snapshots.
    Snapshots,
    /// Your terminal on a new terminal session (a shell, or CMD); Ctrl-] detaches.
    Shell {
        id: Uuid,
        #[arg(last = true)]
        cmd: Vec<String>,
    },
    /// Back on a terminal session (its last output replayed); Ctrl-] detaches.
    Attach { id: Uuid, session: u32 },
    /// The sandbox's connections through the egress proxy (allowed and denied).
    Egress { id: Uuid },
    /// Open PORT of a sandbox at a URL of its own (HTTP and WebSocket); prints the URL.
    Preview {
        id: Uuid,
        port: u16,
        /// Anyone with the URL may open it (no token, no signature).
        #[arg(long)]
        public: bool,
        /// How long the printed (signed) URL works, in seconds.
        #[arg(long)]
        ttl: Option<u64>,
    },
}

#[derive(Args)]
pub struct CreateArgs {
    #[arg(long)]
    template: Option<String>,
    /// Isolation level: runc or gvisor (the server's default when absent).
    #[arg(long, value_parser = parse_isolation)]
    isolation: Option<sandbase_api::sandboxes::Isolation>,
    /// Lifetime in seconds.
    #[arg(long)]
    timeout: Option<u64>,
    /// KEY=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_pair)]
    env: Vec<(String, String)>,
    /// CPU cores (fractions allowed).
    #[arg(long)]
    cpu: Option<f64>,
    /// Memory in MB.
    #[arg(long)]
    memory: Option<u32>,
    /// Size of /work in MB.
    #[arg(long)]
    disk: Option<u32>,
    /// KEY=VALUE label (repeatable).
    #[arg(long = "metadata", value_parser = parse_pair)]
    metadata: Vec<(String, String)>,
    /// VOLUME:PATH (read-only) or VOLUME:PATH:rw — a volume the workers offer (repeatable).
    #[arg(long = "mount", value_parser = parse_mount)]
    mounts: Vec<sandbase_api::sandboxes::Mount>,
    /// Spend cap in credits: the sandbox stops once it has cost this much.
    #[arg(long = "max-credits")]
    max_credits: Option<String>,
    /// Pause by itself after this many seconds without a call (the next call resumes it).
    #[arg(long = "auto-pause")]
    auto_pause: Option<u64>,
    /// Start from this snapshot's /work and /tmp (and its template).
    #[arg(long = "from-snapshot")]
    from_snapshot: Option<Uuid>,
    #[command(flatten)]
    egress: EgressArgs,
}

/// Egress of a sandbox or a run.
#[derive(Args)]
pub struct EgressArgs {
    /// A host it may reach (`api.github.com`, `*.example.org`, `host:8443`; repeatable).
    /// Absent: the team's default policy (`sandbase egress-default`), if any.
    #[arg(long = "egress", conflicts_with = "no_egress")]
    egress: Vec<String>,
    /// Loopback only, whatever the team's default.
    #[arg(long = "no-egress")]
    no_egress: bool,
    /// A vault credential the egress proxy adds to its requests for the credential's hosts
    /// (repeatable); the sandbox never sees its value.
    #[arg(long = "credential")]
    pub(crate) credentials: Vec<String>,
    /// Reach the model and API store from inside: the OpenAI and Anthropic SDKs work with no
    /// key in the sandbox (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL` set; billed as it).
    #[arg(long = "store")]
    pub(crate) store: bool,
}

impl EgressArgs {
    pub(crate) fn policy(&self) -> Option<sandbase_api::sandboxes::EgressPolicy> {
        (self.no_egress || !self.egress.is_empty()).then(|| sandbase_api::sandboxes::EgressPolicy {
            allow: self.egress.clone(),
            deny: Vec::new(),
        })
    }
}

fn parse_mount(value: &str) -> Result<sandbase_api::sandboxes::Mount, String> {
    let mut parts = value.splitn(3, ':');
    let (Some(volume), Some(path)) = (parts.next(), parts.next()) else {
        return Err(format!("`{value}` is not VOLUME:PATH[:rw]"));
    };
    let read_only = match parts.next() {
        None | Some("ro") => true,
        Some("rw") => false,
        Some(other) => return Err(format!("`{other}`: expected rw or ro")),
    };
    Ok(sandbase_api::sandboxes::Mount {
        volume: volume.to_owned(),
        path: path.to_owned(),
        read_only,
    })
}

#[derive(Args)]
pub struct ExecArgs {
    id: Uuid,
    /// Run as the sandbox's root instead of the unprivileged user.
    #[arg(long)]
    root: bool,
    #[arg(long)]
    cwd: Option<String>,
    /// KEY=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_pair)]
    env: Vec<(String, String)>,
    /// Kill the command after this many seconds.
    #[arg(long)]
    timeout: Option<u64>,
    /// Run in this shell session: its working directory and exported variables carry over
    /// to the session's next command.
    #[arg(long)]
    session: Option<String>,
    /// Start it in the background and print its pid (`GET /v1/sandboxes/ID/processes/PID`
    /// has its output).
    #[arg(long, conflicts_with = "session")]
    background: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub(crate) fn parse_pair(value: &str) -> Result<(String, String), String> {
    value
        .split_once('=')
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("`{value}` is not KEY=VALUE"))
}

pub async fn run(global: &GlobalArgs, command: SandboxCommand) -> anyhow::Result<ExitCode> {
    let client = Client::new(global)?;
    client.require_token()?;
    let json = global.json;
    match command {
        SandboxCommand::Create(args) => create(&client, json, args).await?,
        SandboxCommand::Ls { state } => {
            let query: Vec<(&str, String)> =
                state.into_iter().map(|state| ("state", state)).collect();
            let list: SandboxList = client.get("/v1/sandboxes", &query).await?;
            emit(json, &list, print_list)?;
        }
        SandboxCommand::Get { id } => {
            let sandbox: Sandbox = client.get(&format!("/v1/sandboxes/{id}"), &[]).await?;
            emit(json, &sandbox, print_sandbox)?;
        }
        SandboxCommand::Exec(args) => return exec(&client, args).await,
        SandboxCommand::Cp {
            source,
            destination,
        } => copy(&client, &source, &destination).await?,
        SandboxCommand::Export {
            id,
            path,
            to,
            destroy,
        } => {
            let unpacked = download_archive(&client, id, &path, &to).await?;
            eprintln!(
                "{} artifact{} saved ({} of {path}) into {}",
                unpacked.files,
                if unpacked.files == 1 { "" } else { "s" },
                human_bytes(unpacked.bytes),
                to.display()
            );
            // Only once the export is safely written.
            if destroy {
                client.delete(&format!("/v1/sandboxes/{id}")).await?;
                eprintln!("destroyed {id}");
            }
        }
        SandboxCommand::Destroy { id } => {
            client.delete(&format!("/v1/sandboxes/{id}")).await?;
            if !json {
                println!("destroyed {id}");
            }
        }
        SandboxCommand::Extend { id, seconds } => {
            let request = ExtendTimeoutRequest {
                timeout_secs: seconds,
            };
            let sandbox: Sandbox = client
                .post(&format!("/v1/sandboxes/{id}/timeout"), &request)
                .await?;
            println!("{id} now expires at {}", time(&sandbox.expires_at));
        }
        SandboxCommand::Pause { id } => pause_or_resume(&client, json, id, "pause").await?,
        SandboxCommand::Resume { id } => pause_or_resume(&client, json, id, "resume").await?,
        SandboxCommand::Snapshot { id } => crate::snapshot::take(&client, json, id).await?,
        SandboxCommand::Snapshots => crate::snapshot::list(&client, json).await?,
        SandboxCommand::Shell { id, cmd } => return crate::shell::shell(&client, id, cmd).await,
        SandboxCommand::Attach { id, session } => {
            return crate::shell::attach(&client, id, session).await;
        }
        SandboxCommand::Preview {
            id,
            port,
            public,
            ttl,
        } => crate::preview::open(&client, json, id, port, public, ttl).await?,
        SandboxCommand::Egress { id } => {
            let list: sandbase_api::sandboxes::EgressFlowList = client
                .get(&format!("/v1/sandboxes/{id}/egress"), &[])
                .await?;
            emit(json, &list, print_flows)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn create(client: &Client, json: bool, args: CreateArgs) -> anyhow::Result<()> {
    let request = CreateSandboxRequest {
        template: args.template,
        env: args.env.into_iter().collect(),
        cwd: None,
        timeout_secs: args.timeout,
        resources: ResourcesRequest {
            cpu: args.cpu,
            memory_mb: args.memory,
            disk_mb: args.disk,
            pids: None,
        },
        metadata: args.metadata.into_iter().collect(),
        max_credits: args.max_credits,
        egress: args.egress.policy(),
        mounts: args.mounts,
        credentials: args.egress.credentials.clone(),
        isolation: args.isolation,
        auto_pause_after_idle_secs: args.auto_pause,
        snapshot: args.from_snapshot,
        store: args.egress.store,
    };
    let started = std::time::Instant::now();
    let sandbox: Sandbox = client.post("/v1/sandboxes", &request).await?;
    // A person at a terminal is told what they got; scripts read the bare id on stdout.
    if !json && std::io::stderr().is_terminal() {
        eprintln!("{}", ready_line(&sandbox, started.elapsed()));
    }
    emit(json, &sandbox, |sandbox| println!("{}", sandbox.id))
}

async fn pause_or_resume(client: &Client, json: bool, id: Uuid, verb: &str) -> anyhow::Result<()> {
    let sandbox: Sandbox = client
        .post(&format!("/v1/sandboxes/{id}/{verb}"), &json!({}))
        .await?;
    emit(json, &sandbox, |sandbox| {
        println!("{id} is {}", sandbox.state.as_str());
    })
}

/// "✓ sandbox ready in 72 ms (non-root, fs: /work, egress: api.github.com)".
fn ready_line(sandbox: &Sandbox, took: std::time::Duration) -> String {
    let egress = match &sandbox.egress {
        Some(policy) if !policy.allow.is_empty() => policy.allow.join(", "),
        _ => "none".to_owned(),
    };
    format!(
        "✓ sandbox ready in {} ms (non-root, fs: {}, egress: {egress}{})",
        took.as_millis(),
        sandbox.cwd,
        match sandbox.isolation {
            sandbase_api::sandboxes::Isolation::Runc => "",
            sandbase_api::sandboxes::Isolation::Gvisor => ", gVisor",
        }
    )
}

fn print_list(list: &SandboxList) {
    let rows: Vec<Vec<String>> = list
        .sandboxes
        .iter()
        .map(|sandbox| {
            vec![
                sandbox.id.to_string(),
                sandbox.template.clone(),
                state_text(sandbox),
                time(&sandbox.created_at),
                time(&sandbox.expires_at),
            ]
        })
        .collect();
    table(&["ID", "TEMPLATE", "STATE", "CREATED", "EXPIRES"], &rows);
}

fn print_sandbox(sandbox: &Sandbox) {
    let resources = sandbox.resources;
    table(
        &["FIELD", "VALUE"],
        &[
            vec!["id".into(), sandbox.id.to_string()],
            vec!["template".into(), sandbox.template.clone()],
            vec!["state".into(), state_text(sandbox)],
            vec![
                "resources".into(),
                format!(
                    "{} cpu, {} MB memory, {} MB disk, {} pids",
                    f64::from(resources.cpu_millis) / 1000.0,
                    resources.memory_mb,
                    resources.disk_mb,
                    resources.pids
                ),
            ],
            vec!["created".into(), time(&sandbox.created_at)],
            vec!["expires".into(), time(&sandbox.expires_at)],
            vec!["stopped".into(), optional_time(&sandbox.stopped_at)],
        ],
    );
}

fn print_flows(list: &sandbase_api::sandboxes::EgressFlowList) {
    let rows: Vec<Vec<String>> = list
        .flows
        .iter()
        .map(|flow| {
            vec![
                time(&flow.at),
                format!("{}:{}", flow.host, flow.port),
                flow.mode.clone(),
                flow.decision.clone(),
                format!("{}/{}", flow.bytes_up, flow.bytes_down),
                flow.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &["AT", "HOST", "MODE", "DECISION", "BYTES UP/DOWN", "WHY"],
        &rows,
    );
}

fn state_text(sandbox: &Sandbox) -> String {
    match &sandbox.stop_reason {
        Some(reason) => format!("{} ({reason})", sandbox.state.as_str()),
        None => sandbox.state.as_str().to_owned(),
    }
}

/// Streams a command's output to ours and returns its exit code.
async fn exec(client: &Client, args: ExecArgs) -> anyhow::Result<ExitCode> {
    if args.session.is_some() {
        return exec_in_session(client, args).await;
    }
    if args.background {
        let env: BTreeMap<String, String> = args.env.into_iter().collect();
        let body = json!({
            "cmd": args.command,
            "env": env,
            "cwd": args.cwd,
            "user": if args.root { RunAs::Root } else { RunAs::User },
            "background": true,
        });
        let started: sandbase_api::sandboxes::BackgroundStarted = client
            .post(&format!("/v1/sandboxes/{}/exec", args.id), &body)
            .await?;
        println!("{}", started.pid);
        return Ok(ExitCode::SUCCESS);
    }
    // Piped input goes to the command; a terminal is not read.
    let stdin = if std::io::stdin().is_terminal() {
        None
    } else {
        let mut input = Vec::new();
        std::io::stdin().read_to_end(&mut input)?;
        (!input.is_empty()).then(|| String::from_utf8_lossy(&input).into_owned())
    };
    let env: BTreeMap<String, String> = args.env.into_iter().collect();
    let body = json!({
        "cmd": args.command,
        "env": env,
        "cwd": args.cwd,
        "user": if args.root { RunAs::Root } else { RunAs::User },
        "stdin": stdin,
        "timeout_secs": args.timeout,
        "stream": true,
    });
    let response = client
        .stream(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", args.id),
            &[],
            None,
            Some(&body),
        )
        .await?;
    let mut stream = response.bytes_stream();
    let mut pending = Vec::new();
    while let Some(chunk) = stream.next().await {
        pending.extend_from_slice(&chunk.context("reading the command's output")?);
        while let Some(end) = pending.iter().position(|byte| *byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            match serde_json::from_slice::<ExecEvent>(&line)
                .with_context(|| format!("a malformed line: {}", String::from_utf8_lossy(&line)))?
            {
                ExecEvent::Started { .. } => {}
                ExecEvent::Stdout { stdout, .. } => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(stdout.as_bytes())?;
                    out.flush()?;
                }
                ExecEvent::Stderr { stderr, .. } => {
                    let mut err = std::io::stderr().lock();
                    err.write_all(stderr.as_bytes())?;
                    err.flush()?;
                }
                ExecEvent::Exit {
                    exit_code,
                    timed_out,
                    ..
                } => {
                    if timed_out {
                        eprintln!("sandbase: the command timed out");
                    }
                    return Ok(ExitCode::from(exit_code.clamp(0, 255) as u8));
                }
                ExecEvent::Error { error } => bail!("{} ({})", error.message, error.code),
            }
        }
    }
    bail!("the command's output ended without an exit code")
}

pub(crate) fn parse_isolation(value: &str) -> Result<sandbase_api::sandboxes::Isolation, String> {
    sandbase_api::sandboxes::Isolation::parse(value)
        .ok_or_else(|| format!("`{value}` is not an isolation level (runc or gvisor)"))
}

/// A command in a shell session: one whole result (sessions do not stream), printed as
/// the command's own output and exit code.
async fn exec_in_session(client: &Client, args: ExecArgs) -> anyhow::Result<ExitCode> {
    // One argument is a command line for the session's shell; several are a program and
    // its arguments.
    let (cmd, command) = match args.command.as_slice() {
        [line] => (None, Some(line.clone())),
        _ => (Some(args.command.clone()), None),
    };
    let env: BTreeMap<String, String> = args.env.into_iter().collect();
    let body = json!({
        "cmd": cmd,
        "command": command,
        "env": env,
        "cwd": args.cwd,
        "user": if args.root { RunAs::Root } else { RunAs::User },
        "timeout_secs": args.timeout,
        "session": args.session,
    });
    let result: sandbase_api::sandboxes::ExecResult = client
        .post(&format!("/v1/sandboxes/{}/exec", args.id), &body)
        .await?;
    std::io::stdout().write_all(result.stdout.as_bytes())?;
    std::io::stderr().write_all(result.stderr.as_bytes())?;
    if result.timed_out {
        eprintln!("sandbase: the command timed out (its session ended)");
    }
    Ok(ExitCode::from(u8::try_from(result.exit_code).unwrap_or(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_says_what_the_user_got() {
        let sandbox: Sandbox = serde_json::from_value(json!({
            "id": Uuid::nil(), "template": "base", "state": "running", "cwd": "/work",
            "resources": { "cpu_millis": 1000, "memory_mb": 512, "disk_mb": 1024, "pids": 256 },
            "metadata": {}, "created_at": "2026-12-04T00:00:00Z",
            "expires_at": "2026-12-04T00:05:00Z",
            "egress": { "allow": ["api.github.com"], "deny": [] },
        }))
        .unwrap();
        assert_eq!(
            ready_line(&sandbox, std::time::Duration::from_millis(72)),
            "✓ sandbox ready in 72 ms (non-root, fs: /work, egress: api.github.com)"
        );
    }
}
