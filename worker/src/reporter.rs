//! Reports usage to the gateway: every interval (and at once when a sandbox was destroyed)
//! the node samples its sandboxes into the outbox, and the reporter sends it; what the
//! gateway did not acknowledge goes back in.

use std::time::Duration;

use anyhow::Context;
use sandbase_api::internal::{NODE_TOKEN_HEADER, UsageEvent, UsageReport, UsageSample, paths};

use crate::usage::Outbox;

/// Most samples or events in one report.
const REPORT_CHUNK: usize = 2000;

/// Where and how reports go.
#[derive(Debug, Clone)]
pub struct Reporter {
    pub gateway_url: String,
    pub credential: String,
    pub worker_id: String,
    pub interval: Duration,
    /// The internal channel's client side, when it has TLS.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl Reporter {
    /// Sends everything in the outbox; what the gateway did not acknowledge goes back in.
    pub async fn flush(&self, client: &reqwest::Client, outbox: &Outbox) -> anyhow::Result<()> {
        let mut samples = outbox.take();
        while !samples.is_empty() {
            let rest = samples.split_off(samples.len().min(REPORT_CHUNK));
            let chunk = std::mem::replace(&mut samples, rest);
            if let Err(error) = self.send(client, &chunk, &[], &[]).await {
                outbox.put_back(chunk);
                outbox.put_back(samples);
                return Err(error);
            }
        }
        let mut events = outbox.take_events();
        while !events.is_empty() {
            let rest = events.split_off(events.len().min(REPORT_CHUNK));
            let chunk = std::mem::replace(&mut events, rest);
            if let Err(error) = self.send(client, &[], &chunk, &[]).await {
                events.splice(0..0, chunk);
                outbox.put_back_events(events);
                return Err(error);
            }
        }
        let mut audit = outbox.take_audit();
        while !audit.is_empty() {
            let rest = audit.split_off(audit.len().min(REPORT_CHUNK));
            let chunk = std::mem::replace(&mut audit, rest);
            if let Err(error) = self.send(client, &[], &[], &chunk).await {
                audit.splice(0..0, chunk);
                outbox.put_back_audit(audit);
                return Err(error);
            }
        }
        Ok(())
    }

    async fn send(
        &self,
        client: &reqwest::Client,
        samples: &[UsageSample],
        events: &[UsageEvent],
        audit: &[sandbase_api::internal::NodeAuditEvent],
    ) -> anyhow::Result<()> {
        let answer = client
            .post(format!("{}{}", self.gateway_url, paths::USAGE))
            .header(NODE_TOKEN_HEADER, &self.credential)
            .json(&UsageReport {
                worker: self.worker_id.clone(),
                samples: samples.to_vec(),
                events: events.to_vec(),
                audit: audit.to_vec(),
            })
            .send()
            .await
            .context("reporting usage")?;
        let status = answer.status();
        if status.is_client_error() && status != reqwest::StatusCode::UNAUTHORIZED {
            // A report the gateway refuses as invalid would be refused forever.
            let body = answer.text().await.unwrap_or_default();
            tracing::error!(%status, body, "the gateway refused usage samples; dropped");
            return Ok(());
        }
        anyhow::ensure!(status.is_success(), "the gateway refused usage: {status}");
        Ok(())
    }

    /// Samples every hosted sandbox each interval (and sends at once when a sandbox was
    /// destroyed) until `stop` resolves.
    pub async fn run(
        self,
        node: std::sync::Arc<crate::node::Node>,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let client =
            match crate::registration::gateway_client(self.tls.as_deref(), Duration::from_secs(15))
            {
                Ok(client) => client,
                Err(error) => {
                    tracing::error!(error = %error, "no HTTP client for usage reports");
                    return;
                }
            };
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = tick.tick() => node.sample_all(),
                () = node.usage().wake.notified() => {}
            }
            if let Err(error) = self.flush(&client, node.usage()).await {
                tracing::warn!(
                    error = format!("{error:#}"),
                    pending = node.usage().len(),
                    "usage report failed; kept for the next"
                );
            }
        }
    }
}
