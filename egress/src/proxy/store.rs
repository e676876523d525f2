//! The store host ([`crate::STORE_HOST`]): a sandbox created with store access calls
//! SandBase's model and API store there over plain HTTP, and the proxy forwards each request
//! to the gateway — over the internal channel's TLS when it has it — with the sandbox's store
//! credential as `Authorization`, after taking out whatever credentials the sandbox put in
//! (its SDKs send a placeholder key). The sandbox never holds the credential; a sandbox
//! without store access, a path outside the store's routes or TLS to the name are refused.
//! The bytes are the store's to bill, not egress: they are not added to the sandbox's meter.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::net::TcpStream;

use super::session::{Session, upstream_http};
use super::store_rules::StoreAccess;
use super::{Connection, Decision, Entry, Flow, Listener, Proxy, deny};
use crate::process::StoreUpstream;
use crate::stream::Tap;

/// Where the store host's requests go: the gateway's address, its name for TLS, and the
/// trust for it (the internal channel's CA alone).
pub struct StoreRoute {
    host: String,
    port: u16,
    authority: HeaderValue,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl StoreRoute {
    pub fn new(upstream: &StoreUpstream) -> Result<StoreRoute, String> {
        let uri: http::Uri = upstream
            .url
            .parse()
            .map_err(|error| format!("the store's gateway URL {}: {error}", upstream.url))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(format!(
                    "the store's gateway URL {} is not http(s)",
                    upstream.url
                ));
            }
        };
        let host = uri
            .host()
            .ok_or_else(|| format!("the store's gateway URL {} has no host", upstream.url))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = uri
            .authority()
            .and_then(|authority| HeaderValue::from_str(authority.as_str()).ok())
            .ok_or_else(|| format!("the store's gateway URL {} has no authority", upstream.url))?;
        // The channel's CA alone when there is one; the system's roots otherwise.
        let tls = match (&upstream.ca_pem, https) {
            (_, false) => None,
            (Some(ca), true) => Some(Arc::new(crate::channel::client_trusting(ca.as_bytes())?)),
            (None, true) => Some(crate::tls::upstream_config(None)?),
        };
        Ok(StoreRoute {
            host,
            port,
            authority,
            tls,
        })
    }

    /// An HTTP/1.1 connection to the gateway.
    async fn connect(
        &self,
        timeout: Duration,
    ) -> Result<hyper::client::conn::http1::SendRequest<super::session::UpstreamBody>, String> {
        let gateway = format!("the store ({}:{})", self.host, self.port);
        let stream =
            tokio::time::timeout(timeout, TcpStream::connect((self.host.as_str(), self.port)))
                .await
                .map_err(|_| format!("{gateway} did not answer in time"))?
                .map_err(|error| format!("{gateway}: {error}"))?;
        let _ = stream.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return upstream_http(stream, &gateway).await;
        };
        let name = rustls::pki_types::ServerName::try_from(self.host.clone())
            .map_err(|_| format!("{} is not a valid TLS server name", self.host))?;
        let stream = tokio::time::timeout(
            timeout,
            tokio_rustls::TlsConnector::from(Arc::clone(tls)).connect(name, stream),
        )
        .await
        .map_err(|_| format!("{gateway} did not complete a TLS handshake in time"))?
        .map_err(|error| format!("TLS with {gateway} failed: {error}"))?;
        upstream_http(stream, &gateway).await
    }
}

impl Proxy {
    /// A connection to the store host: refused unless the sandbox has store access and it
    /// is plain HTTP; otherwise served request by request towards the gateway.
    pub(super) async fn to_store(&self, entry: &Entry, connection: Connection, flow: &mut Flow) {
        let Connection {
            mut stream,
            kind,
            target,
            buffer,
            ..
        } = connection;
        let allowed = match (&self.config.store, &entry.store) {
            (None, _) => Err((502, "this node has no route to the store".to_owned())),
            (_, None) => Err((
                403,
                "this sandbox was not created with store access (`\"store\": true`)".to_owned(),
            )),
            _ if !target.plain || target.port != 80 => Err((
                403,
                format!(
                    "the store is reached at http://{} (the node encrypts the rest of the way)",
                    crate::STORE_HOST
                ),
            )),
            (Some(route), Some(token)) => Ok((route, token)),
        };
        let (route, token) = match allowed {
            Ok(allowed) => allowed,
            Err((status, why)) => {
                if kind != Listener::TransparentTls {
                    let _ = deny(&mut stream, status, &why).await;
                }
                flow.decision = if status == 403 {
                    Decision::Denied(why)
                } else {
                    Decision::Failed(why)
                };
                return;
            }
        };
        let Ok(mut authorization) = HeaderValue::from_str(&format!("Bearer {}", token.as_str()))
        else {
            flow.decision = Decision::Failed("the store credential is malformed".to_owned());
            return;
        };
        authorization.set_sensitive(true);
        // Not the sandbox's meter: these bytes are billed by the store.
        let tap = Tap::new(stream, buffer, Arc::default());
        let session = Session::new(
            None,
            false,
            kind == Listener::Explicit,
            &target,
            flow,
            Arc::clone(&tap.counters),
            self,
        );
        session.grant_store(StoreAccess::new(authorization, route.authority.clone()));
        match route.connect(self.config.connect_timeout).await {
            Ok(sender) => *session.sender.lock().await = Some(sender),
            Err(why) => *session.problem.lock().unwrap_or_else(|p| p.into_inner()) = Some(why),
        }
        self.serve_session(session, tap, flow).await;
    }
}
