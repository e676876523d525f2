//! The worker's side of its link with the gateway: register once started, then heartbeat
//! capacity, templates and hosted sandboxes; remove what the gateway says should not exist
//! and, now and then, anything of ours on the node that no sandbox accounts for.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sandbase_api::internal::{Heartbeat, HeartbeatReply, NODE_TOKEN_HEADER, RegisterWorker, paths};

use crate::node::Node;

#[derive(Debug, Clone)]
pub struct GatewayLink {
    /// The gateway's base URL, e.g. `http://127.0.0.1:8080`.
    pub gateway_url: String,
    pub credential: String,
    /// This worker's stable name (its node name).
    pub worker_id: String,
    /// Where the gateway reaches this worker's internal API.
    pub advertise_url: String,
    pub heartbeat_interval: Duration,
    /// The internal channel's client side, when it has TLS.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// How many heartbeats between two sweeps for orphans.
const ORPHAN_SWEEP_EVERY: u32 = 15;

/// A client of the gateway's internal listener: verified against the channel's CA when the
/// channel has TLS.
pub fn gateway_client(
    tls: Option<&rustls::ClientConfig>,
    timeout: Duration,
) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder().timeout(timeout);
    if let Some(tls) = tls {
        builder = builder.use_preconfigured_tls(tls.clone());
    }
    Ok(builder.build()?)
}

impl GatewayLink {
    fn client(&self) -> anyhow::Result<reqwest::Client> {
        gateway_client(self.tls.as_deref(), Duration::from_secs(10))
    }

    pub async fn register(&self, client: &reqwest::Client, node: &Node) -> anyhow::Result<()> {
        let body = RegisterWorker {
            id: self.worker_id.clone(),
            url: self.advertise_url.clone(),
            capacity: node.capacity() as u32,
            templates: node.templates().await?,
            volumes: node.volume_infos(),
            isolations: node.runtime().isolations(),
        };
        let answer = client
            .post(format!("{}{}", self.gateway_url, paths::WORKER_REGISTER))
            .header(NODE_TOKEN_HEADER, &self.credential)
            .json(&body)
            .send()
            .await
            .context("registering with the gateway")?;
        anyhow::ensure!(
            answer.status().is_success(),
            "the gateway refused the registration: {} {}",
            answer.status(),
            answer.text().await.unwrap_or_default()
        );
        Ok(())
    }

    /// One heartbeat; `Ok(None)` when the gateway does not know this worker (register again).
    pub async fn heartbeat(
        &self,
        client: &reqwest::Client,
        node: &Node,
    ) -> anyhow::Result<Option<HeartbeatReply>> {
        let body = Heartbeat {
            id: self.worker_id.clone(),
            url: self.advertise_url.clone(),
            capacity: node.capacity() as u32,
            templates: node.templates().await?,
            volumes: node.volume_infos(),
            sandboxes: node.ids(),
            paused: node.paused_ids(),
            healthy: node.healthy(),
            memory_mb: node.allocatable_memory_mb(),
            reserved_memory_mb: node.reserved_memory_mb(),
            cpu_millis: node.allocatable_cpu_millis(),
            reserved_cpu_millis: node.reserved_cpu_millis(),
            isolations: node.runtime().isolations(),
        };
        let answer = client
            .post(format!("{}{}", self.gateway_url, paths::WORKER_HEARTBEAT))
            .header(NODE_TOKEN_HEADER, &self.credential)
            .json(&body)
            .send()
            .await
            .context("sending a heartbeat")?;
        if answer.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        anyhow::ensure!(
            answer.status().is_success(),
            "the gateway refused a heartbeat: {}",
            answer.status()
        );
        Ok(Some(answer.json().await?))
    }

    /// Registers (retrying until the gateway answers) and heartbeats until `stop` resolves.
    pub async fn run(self, node: Arc<Node>, stop: impl std::future::Future<Output = ()>) {
        let client = match self.client() {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(
                    error = format!("{error:#}"),
                    "no HTTP client for the gateway link"
                );
                return;
            }
        };
        tokio::pin!(stop);
        let mut registered = false;
        let mut beats = 0u32;
        loop {
            if registered {
                match self.heartbeat(&client, &node).await {
                    Ok(Some(reply)) => {
                        for id in reply.destroy {
                            tracing::info!(%id, "removing a sandbox the gateway no longer has");
                            if let Err(error) = node.destroy(id).await {
                                tracing::warn!(%id, error = format!("{error:#}"), "removal failed");
                            }
                        }
                    }
                    Ok(None) => registered = false,
                    Err(error) => {
                        tracing::warn!(error = format!("{error:#}"), "heartbeat failed");
                    }
                }
                beats = beats.wrapping_add(1);
                if beats.is_multiple_of(ORPHAN_SWEEP_EVERY) {
                    match node.runtime().remove_orphans().await {
                        Ok(0) => {}
                        Ok(removed) => tracing::warn!(removed, "removed orphaned sandboxes"),
                        Err(error) => {
                            tracing::warn!(error = format!("{error:#}"), "orphan sweep failed")
                        }
                    }
                }
            }
            if !registered {
                match self.register(&client, &node).await {
                    Ok(()) => {
                        tracing::info!(worker = %self.worker_id, gateway = %self.gateway_url, "registered");
                        registered = true;
                        continue;
                    }
                    Err(error) => {
                        tracing::warn!(
                            error = format!("{error:#}"),
                            "registration failed; retrying"
                        );
                    }
                }
            }
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(self.heartbeat_interval) => {}
            }
        }
    }
}
