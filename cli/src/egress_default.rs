//! `sandbase egress-default`: the team's default egress policy, which sandboxes and runs that
//! say nothing about egress get.

use sandbase_api::sandboxes::EgressPolicy;

use crate::args::GlobalArgs;
use crate::client::Client;
use crate::output::emit;

#[derive(clap::Subcommand)]
pub enum EgressDefaultCommand {
    /// Show it (the default when no subcommand is given).
    Show,
    /// Set it (admins): the hosts sandboxes and runs may reach unless they say otherwise.
    Set {
        /// A host pattern (`api.github.com`, `*.example.org`, `host:8443`).
        #[arg(required = true)]
        allow: Vec<String>,
        /// A host pattern refused even when `allow` matches it (repeatable).
        #[arg(long)]
        deny: Vec<String>,
    },
    /// Remove it (admins): sandboxes and runs without `--egress` keep loopback only.
    Clear,
}

pub async fn run(global: &GlobalArgs, command: Option<EgressDefaultCommand>) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    let policy: Option<EgressPolicy> = match command.unwrap_or(EgressDefaultCommand::Show) {
        EgressDefaultCommand::Show => client.get("/v1/egress-policy", &[]).await?,
        EgressDefaultCommand::Set { allow, deny } => Some(
            client
                .put("/v1/egress-policy", &EgressPolicy { allow, deny })
                .await?,
        ),
        EgressDefaultCommand::Clear => {
            client.delete("/v1/egress-policy").await?;
            None
        }
    };
    emit(global.json, &policy, |policy| match policy {
        None => println!("no default: sandboxes and runs without --egress keep loopback only"),
        Some(policy) => {
            println!("allow: {}", policy.allow.join(" "));
            if !policy.deny.is_empty() {
                println!("deny:  {}", policy.deny.join(" "));
            }
        }
    })
}
