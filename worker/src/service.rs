//! The worker as a service: connect to containerd, remove what a predecessor left, make sure
//! the configured templates exist, start the warm pools, serve the internal API, and keep
//! the link with the gateway. `sandbase worker` and `sandbase dev` run this.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::node::{Node, NodeConfig};
use crate::registration::GatewayLink;
use crate::runtime::{Runtime, RuntimeConfig};

/// Where a template comes from when the worker builds it at start-up.
#[derive(Debug, Clone)]
pub enum TemplateSource {
    /// The host's statically linked busybox.
    Busybox,
    /// A root file system tarball (such as the Debian `base` of `scripts/setup`).
    Tarball(PathBuf),
}

#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub worker: RuntimeConfig,
    pub node: NodeConfig,
    pub listen: SocketAddr,
    /// The URL the gateway should call; `http://<bound address>` when absent.
    pub advertise_url: Option<String>,
    pub gateway_url: String,
    pub credential: String,
    /// TLS of the internal channel: this worker serves its API with it and verifies the
    /// gateway against its CA.
    pub tls: Option<sandbase_egress::channel::ChannelTls>,
    pub worker_id: String,
    pub heartbeat_interval: Duration,
    /// How often hosted sandboxes' usage is sampled and reported (at most 10 s).
    pub usage_interval: Duration,
    /// Templates built at start-up when missing.
    pub templates: Vec<(String, TemplateSource)>,
}

pub struct RunningService {
    local_addr: SocketAddr,
    node: Arc<Node>,
    server: JoinHandle<()>,
    link: JoinHandle<()>,
    reporter: JoinHandle<()>,
    usage: crate::reporter::Reporter,
    stop: tokio::sync::watch::Sender<bool>,
}

/// Serves the worker's internal API (over TLS with `tls`) until `stop` turns true.
async fn serve(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let shutdown = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let served = match tls {
        None => {
            use axum::serve::ListenerExt;
            // Answers and relayed bytes go out at once (no Nagle wait on small writes).
            let listener = listener.tap_io(|stream| {
                let _ = stream.set_nodelay(true);
            });
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(tls) => {
            axum::serve(crate::tls_listener::TlsListener::new(listener, tls), router)
                .with_graceful_shutdown(shutdown)
                .await
        }
    };
    if let Err(error) = served {
        tracing::error!(error = %error, "the worker's internal API stopped");
    }
}

/// Starts the worker service; it runs until [`RunningService::stop`].
/// How much less likely than an ordinary process the worker (and the proxy it starts, which
/// inherits it) is to be taken by the host's OOM killer; sandboxes are at 1000.
const WORKER_OOM_SCORE_ADJ: &str = "-900";

/// Lowers this process's OOM score (best effort: it needs root, which a worker has).
fn protect_from_the_oom_killer() {
    if let Err(error) = std::fs::write("/proc/self/oom_score_adj", WORKER_OOM_SCORE_ADJ) {
        tracing::warn!(%error, "could not lower the worker's OOM score");
    }
}

/// Where the node's proxy sends sandboxes' store requests: the gateway, as this worker
/// reaches it (the internal channel's CA trusted alone when it has TLS).
fn store_route(config: &ServiceConfig) -> sandbase_egress::process::StoreUpstream {
    sandbase_egress::process::StoreUpstream {
        url: config.gateway_url.trim_end_matches('/').to_owned(),
        ca_pem: config.tls.as_ref().map(|tls| tls.ca_pem.clone()),
    }
}

pub async fn start(config: ServiceConfig) -> anyhow::Result<RunningService> {
    let named = sandbase_api::internal::credential_worker_id(&config.credential);
    anyhow::ensure!(
        named == Some(config.worker_id.as_str()),
        "the worker credential names {}, not this worker ({}): get this worker's own with \
         `sandbase admin worker-credential --worker-id {}`",
        named.unwrap_or("no worker"),
        config.worker_id,
        config.worker_id
    );
    protect_from_the_oom_killer();
    let (worker, removed) = Runtime::start(config.worker.clone()).await?;
    if removed > 0 {
        tracing::warn!(removed, "removed sandboxes a previous worker left behind");
    }
    for (name, source) in &config.templates {
        ensure_template(&worker, name, source).await?;
    }
    let worker = Arc::new(worker);
    // Without its egress network (no nftables, no permission) the worker still runs
    // sandboxes with loopback only, and refuses those that ask for egress.
    let network = match &config.node.egress {
        Some(egress) => {
            match crate::network::Network::start(egress.clone(), Some(store_route(&config))).await {
                Ok(network) => Some(network),
                Err(error) => {
                    tracing::error!(
                        error = format!("{error:#}"),
                        "no egress network: sandboxes asking for egress will be refused"
                    );
                    None
                }
            }
        }
        None => None,
    };
    let node = Node::start(Arc::clone(&worker), config.node.clone(), network);
    crate::pause::spawn_idle_pauser(&node);
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding the worker's internal API to {}", config.listen))?;
    let local_addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let router = crate::api::router(Arc::clone(&node), &config.credential);
    let server = tokio::spawn(serve(
        listener,
        router,
        config.tls.as_ref().map(|tls| Arc::clone(&tls.server)),
        stopped.clone(),
    ));
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let client_tls = config.tls.as_ref().map(|tls| Arc::clone(&tls.client));
    let link = GatewayLink {
        gateway_url: config.gateway_url.trim_end_matches('/').to_owned(),
        credential: config.credential.clone(),
        worker_id: config.worker_id.clone(),
        advertise_url: config
            .advertise_url
            .clone()
            .unwrap_or_else(|| format!("{scheme}://{local_addr}")),
        heartbeat_interval: config.heartbeat_interval,
        tls: client_tls.clone(),
    };
    let usage = crate::reporter::Reporter {
        gateway_url: link.gateway_url.clone(),
        credential: config.credential.clone(),
        worker_id: config.worker_id.clone(),
        interval: config.usage_interval.min(Duration::from_secs(10)),
        tls: client_tls,
    };
    node.set_recording_sink(crate::recording::RecordingSink {
        gateway_url: link.gateway_url.clone(),
        credential: config.credential.clone(),
        http: crate::registration::gateway_client(
            config.tls.as_ref().map(|tls| tls.client.as_ref()),
            Duration::from_secs(30),
        )?,
    });
    let mut reporter_stop = stopped.clone();
    let reporter = tokio::spawn(usage.clone().run(Arc::clone(&node), async move {
        let _ = reporter_stop.wait_for(|stop| *stop).await;
    }));
    let mut link_stop = stopped;
    let link = tokio::spawn(link.run(Arc::clone(&node), async move {
        let _ = link_stop.wait_for(|stop| *stop).await;
    }));
    Ok(RunningService {
        local_addr,
        node,
        server,
        link,
        reporter,
        usage,
        stop,
    })
}

/// Builds `name` from `source` unless this namespace has it already.
pub async fn ensure_template(
    worker: &Runtime,
    name: &str,
    source: &TemplateSource,
) -> anyhow::Result<()> {
    if worker.containerd().template_exists(name).await? {
        return Ok(());
    }
    let base = worker.config().id_base;
    tracing::info!(template = name, "building template");
    let source = source.clone();
    worker
        .containerd()
        .build_template(name, move |rootfs| match &source {
            TemplateSource::Busybox => crate::templates::busybox(rootfs, base),
            TemplateSource::Tarball(tarball) => {
                crate::templates::from_tarball(rootfs, tarball, base)
            }
        })
        .await
        .with_context(|| format!("building template `{name}`"))
}

impl RunningService {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Stops serving, destroys every sandbox and the warm pools.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.link.await;
        let _ = self.reporter.await;
        let _ = self.server.await;
        self.node.shut_down().await;
        // The last samples of what shut-down destroyed, and the last egress usage.
        self.node.sample_all();
        if let Ok(client) =
            crate::registration::gateway_client(self.usage.tls.as_deref(), Duration::from_secs(5))
            && let Err(error) = self.usage.flush(&client, self.node.usage()).await
        {
            tracing::warn!(error = format!("{error:#}"), "the last usage report failed");
        }
    }

    /// Stops at once and leaves every sandbox running, as a crash would (for tests of
    /// what the next start and the gateway do about it).
    pub fn abandon(self) {
        self.node.abandon();
        self.link.abort();
        self.reporter.abort();
        self.server.abort();
    }
}
