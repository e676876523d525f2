//! Serving a router on a listener with hyper directly, so that slow and greedy clients are
//! bounded: a timer and a header-read timeout (a client that trickles its headers is cut
//! off), at most `max_connections` open connections (the next waits to be accepted) and
//! `max_connections_per_ip` from one address (the next is closed at once; a trusted proxy
//! carries many clients' connections, so it is held by `max_connections` only and its
//! clients by their per-request limits), and a graceful shutdown that lets in-flight requests finish.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt;

/// How a listener bounds its clients.
#[derive(Debug, Clone)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
    /// 0: no limit per address.
    pub max_connections_per_ip: usize,
    /// Peers exempt from the per-address cap: the configured trusted proxies.
    pub trusted_proxies: Arc<[crate::config::Cidr]>,
}

impl Limits {
    pub fn from_settings(server: &crate::config::ServerSettings) -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(server.header_read_timeout_secs),
            max_connections: server.max_connections,
            max_connections_per_ip: server.max_connections_per_ip,
            trusted_proxies: server.trusted_proxies.clone().into(),
        }
    }
}

/// Serves `router` (over TLS with `tls`) until `stop` turns true, then waits for open
/// connections to finish their requests for at most `grace`. Handlers see the peer as
/// `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_ip = Arc::new(PerIp::default());
    loop {
        let accepted = tokio::select! {
            accepted = accept(&listener, &slots) => accepted,
            () = stopped(&mut stop) => break,
        };
        let Some((stream, peer, slot)) = accepted else {
            continue;
        };
        let proxied = limits
            .trusted_proxies
            .iter()
            .any(|cidr| cidr.contains(peer.ip()));
        let entry = if proxied {
            None
        } else {
            let Some(entry) = per_ip.enter(peer.ip(), limits.max_connections_per_ip) else {
                metrics::counter!("sandbase_connections_refused_total").increment(1);
                drop(stream);
                continue;
            };
            Some(entry)
        };
        let router = router.clone();
        let limits = limits.clone();
        let stop = stop.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => connection(stream, peer, router, limits, stop).await,
                Some(acceptor) => {
                    // The handshake gets as long as the headers would.
                    let handshake = acceptor.accept(stream);
                    match tokio::time::timeout(limits.header_read_timeout, handshake).await {
                        Ok(Ok(stream)) => connection(stream, peer, router, limits, stop).await,
                        Ok(Err(error)) => {
                            tracing::debug!(error = %error, %peer, "TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
            drop(entry);
            drop(slot);
        });
    }
    drop(listener);
    // Every connection holds a slot until it ends: all slots back means all done.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within the grace period");
    }
}

/// Serves one connection until it ends, or until `stop` (then after its request in flight).
async fn connection<I>(
    io: I,
    peer: SocketAddr,
    router: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        router.clone().oneshot(request)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        () = stopped(&mut stop) => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = ended {
        tracing::debug!(error = %error, %peer, "connection ended with an error");
    }
}

/// Returns once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The next connection, once a slot is free. `None` when accepting failed (the error is
/// logged; a full file table is waited out).
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> Option<(TcpStream, SocketAddr, tokio::sync::OwnedSemaphorePermit)> {
    let slot = Arc::clone(slots).acquire_owned().await.ok()?;
    match listener.accept().await {
        Ok((stream, peer)) => {
            let _ = stream.set_nodelay(true);
            Some((stream, peer, slot))
        }
        Err(error) => {
            // EMFILE and friends: back off instead of spinning.
            tracing::warn!(error = %error, "accepting a connection failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// Open connections per address.
#[derive(Default)]
struct PerIp {
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl PerIp {
    fn enter(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<PerIpEntry> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = open.entry(ip).or_default();
        if limit > 0 && *count >= limit {
            return None;
        }
        *count += 1;
        Some(PerIpEntry {
            book: Arc::clone(self),
            ip,
        })
    }
}

/// One open connection of an address, counted until dropped.
struct PerIpEntry {
    book: Arc<PerIp>,
    ip: IpAddr,
}

impl Drop for PerIpEntry {
    fn drop(&mut self) {
        let mut open = self
            .book
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}
