//! A sandbox's HTTP connection, request by request (intercepted TLS, or plain HTTP): each
//! request goes through named phases — check the host, strip proxy headers, inject
//! credentials, scan the body — before it is forwarded; upgrades are relayed.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::body::Filtered;
use super::store_rules::{STORE_CREDENTIAL, StoreAccess};
use super::target::{Target, split_authority};
use super::{Decision, Flow, Interception, Listener, Proxy};
use crate::body_scan::BodyScan;
use crate::credentials::{Credential, Outcome};
use crate::scrub::{Scrub, ScrubRules};
use crate::stream::Tap;

impl Proxy {
    /// Opens the sandbox's TLS with a certificate from its CA, the upstream's with the real
    /// one verified, and relays request by request: credentials injected, placeholders
    /// bound for other hosts stopped.
    pub(super) async fn intercept(
        &self,
        stream: Tap<TcpStream>,
        interception: Arc<Interception>,
        target: &Target,
        upstream: TcpStream,
        flow: &mut Flow,
    ) {
        flow.intercepted = true;
        let counters = Arc::clone(&stream.counters);
        let server = match interception.authority.server_config(&target.host) {
            Ok(config) => config,
            Err(why) => {
                flow.decision = Decision::Failed(format!("no certificate for the host: {why}"));
                return;
            }
        };
        let accepted = tokio::time::timeout(
            self.config.head_timeout,
            tokio_rustls::TlsAcceptor::from(server).accept(stream),
        )
        .await;
        let Ok(Ok(downstream)) = accepted else {
            flow.decision = Decision::Failed(
                "the sandbox's TLS handshake failed (does its client trust the sandbox CA?)"
                    .to_owned(),
            );
            return;
        };
        let session = Session::new(
            Some(interception),
            true,
            false,
            target,
            flow,
            counters,
            self,
        );
        match self.upstream_tls(&target.host, upstream).await {
            Ok(sender) => *session.sender.lock().await = Some(sender),
            Err(why) => *session.problem.lock().unwrap_or_else(|p| p.into_inner()) = Some(why),
        }
        self.serve_session(session, downstream, flow).await;
    }

    /// Plain HTTP, request by request: each must name the connection's host, and no
    /// placeholder leaves in its head or body (credentials travel only over TLS). Upgrades
    /// (WebSocket) are passed on. Explicit proxy connections take one request each: the next
    /// one on them may be for another host.
    pub(super) async fn plain(
        &self,
        stream: Tap<TcpStream>,
        interception: Option<Arc<Interception>>,
        target: &Target,
        kind: Listener,
        upstream: TcpStream,
        flow: &mut Flow,
    ) {
        let counters = Arc::clone(&stream.counters);
        let session = Session::new(
            interception,
            false,
            kind == Listener::Explicit,
            target,
            flow,
            counters,
            self,
        );
        match upstream_http(upstream, &target.host).await {
            Ok(sender) => *session.sender.lock().await = Some(sender),
            Err(why) => *session.problem.lock().unwrap_or_else(|p| p.into_inner()) = Some(why),
        }
        self.serve_session(session, stream, flow).await;
    }

    /// Serves a sandbox's HTTP connection through a session until it closes (and any
    /// upgraded connection it became has ended), then fills in its flow.
    pub(super) async fn serve_session<S>(
        &self,
        session: Arc<Session>,
        downstream: S,
        flow: &mut Flow,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = {
            let session = Arc::clone(&session);
            hyper::service::service_fn(move |request| {
                let session = Arc::clone(&session);
                async move { Ok::<_, Infallible>(session.forward(request).await) }
            })
        };
        // A kept-alive connection that sends no new request within the idle timeout closes.
        // A client that shuts its side after the request (`printf … | nc`) still gets the
        // answer.
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .half_close(true)
            .header_read_timeout(self.config.idle_timeout)
            .serve_connection(TokioIo::new(downstream), service)
            .with_upgrades()
            .await;
        let upgraded = session
            .upgraded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(upgraded) = upgraded {
            let _ = upgraded.await;
        }
        flow.bytes_up = session.counters.up.load(Ordering::Relaxed);
        flow.bytes_down = session.counters.down.load(Ordering::Relaxed);
        flow.credentials = session
            .injected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        if let Some(why) = session
            .problem
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            flow.decision = Decision::Failed(why);
        }
    }

    /// TLS to the upstream, verified, and an HTTP/1.1 connection over it.
    async fn upstream_tls(
        &self,
        host: &str,
        upstream: TcpStream,
    ) -> Result<hyper::client::conn::http1::SendRequest<UpstreamBody>, String> {
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|_| format!("{host} is not a valid TLS server name"))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.config.upstream_tls));
        let tls = tokio::time::timeout(
            self.config.connect_timeout,
            connector.connect(name, upstream),
        )
        .await
        .map_err(|_| format!("{host} did not complete a TLS handshake in time"))?
        .map_err(|error| format!("TLS with {host} failed: {error}"))?;
        upstream_http(tls, host).await
    }
}

/// An answer to the sandbox: the upstream's body (scrubbed when the connection carries
/// credentials), or the proxy's own.
type Answer = hyper::Response<Either<Either<Incoming, Filtered<Scrub>>, Full<Bytes>>>;
/// A request body as it goes upstream: untouched, or scanned for placeholders.
pub(super) type UpstreamBody = Either<Incoming, Filtered<BodyScan>>;

/// A sandbox's HTTP connection (intercepted TLS, or plain HTTP): its upstream and what its
/// requests used.
pub(super) struct Session {
    pub(super) sender:
        tokio::sync::Mutex<Option<hyper::client::conn::http1::SendRequest<UpstreamBody>>>,
    /// Why the upstream cannot be used (every request is answered 502 with it).
    pub(super) problem: Mutex<Option<String>>,
    /// To the store host: what each request gets instead of the sandbox's credentials.
    store: std::sync::OnceLock<StoreAccess>,
    interception: Option<Arc<Interception>>,
    /// Over TLS: credentials bound to the host are added. In plain text none are, and any
    /// placeholder stops its request.
    tls: bool,
    /// Every answer closes the connection.
    one_request: bool,
    mode: String,
    host: String,
    port: u16,
    injected: Mutex<BTreeSet<String>>,
    flows: mpsc::Sender<Flow>,
    sandbox: String,
    address: Option<SocketAddr>,
    /// Bytes to and from the sandbox.
    counters: Arc<crate::stream::Counters>,
    idle_timeout: Duration,
    /// The relay of a connection upgraded (101) to another protocol.
    upgraded: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Over TLS to a host with credentials: what comes back is scrubbed of their values.
    scrub: Option<Arc<ScrubRules>>,
}

impl Session {
    pub(super) fn new(
        interception: Option<Arc<Interception>>,
        tls: bool,
        one_request: bool,
        target: &Target,
        flow: &Flow,
        counters: Arc<crate::stream::Counters>,
        proxy: &Proxy,
    ) -> Arc<Session> {
        let scrub = interception
            .as_deref()
            .filter(|_| tls)
            .and_then(|i| ScrubRules::for_host(&i.credentials, &target.host, target.port));
        Arc::new(Session {
            scrub,
            sender: tokio::sync::Mutex::new(None),
            problem: Mutex::new(None),
            store: std::sync::OnceLock::new(),
            interception,
            tls,
            one_request,
            mode: flow.mode.clone(),
            host: target.host.clone(),
            port: target.port,
            injected: Mutex::new(BTreeSet::new()),
            flows: proxy.flows.clone(),
            sandbox: flow.sandbox.clone(),
            address: flow.address,
            counters,
            idle_timeout: proxy.config.idle_timeout,
            upgraded: Mutex::new(None),
        })
    }

    /// Makes this a session to the store host.
    pub(super) fn grant_store(&self, access: StoreAccess) {
        let _ = self.store.set(access);
    }

    fn credentials(&self) -> &[Credential] {
        self.interception
            .as_deref()
            .map_or(&[], |interception| &interception.credentials)
    }
}

/// An HTTP/1.1 client connection over `io` (upgrades allowed), driven by a task of its own.
pub(super) async fn upstream_http<I>(
    io: I,
    host: &str,
) -> Result<hyper::client::conn::http1::SendRequest<UpstreamBody>, String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|error| format!("HTTP with {host} failed: {error}"))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    Ok(sender)
}

/// Whether an upstream's answer ends its connection (so the sandbox's must end too).
fn closes<B>(response: &hyper::Response<B>) -> bool {
    let connection = response
        .headers()
        .get(http::header::CONNECTION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    connection.contains("close")
        || (response.version() == http::Version::HTTP_10 && !connection.contains("keep-alive"))
}

/// The two sides of a connection that switched protocols, and the scrub of what comes back
/// when it carried credentials.
struct Upgraded {
    downstream: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    scrub: Option<Arc<ScrubRules>>,
}

/// Relays an upgraded connection until both ends close or nothing moves for `idle`; on a
/// connection that carried credentials the upstream's side is scrubbed like any answer
/// (an upstream may write the request it got into the new protocol).
async fn relay_upgraded(
    upgraded: Upgraded,
    counters: Arc<crate::stream::Counters>,
    idle: Duration,
) {
    let (Ok(downstream), Ok(upstream)) = tokio::join!(upgraded.downstream, upgraded.upstream)
    else {
        return;
    };
    let (mut downstream, mut upstream) = (TokioIo::new(downstream), TokioIo::new(upstream));
    let quiet = async {
        loop {
            let moved = |c: &crate::stream::Counters| {
                c.up.load(Ordering::Relaxed) + c.down.load(Ordering::Relaxed)
            };
            let before = moved(&counters);
            tokio::time::sleep(idle).await;
            if moved(&counters) == before {
                return;
            }
        }
    };
    let Some(rules) = upgraded.scrub else {
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut downstream, &mut upstream) => {}
            () = quiet => {}
        }
        return;
    };
    let (mut down_read, mut down_write) = tokio::io::split(downstream);
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    let up = async {
        let _ = tokio::io::copy(&mut down_read, &mut up_write).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut up_write).await;
    };
    let down = crate::scrub::copy_scrubbed(&mut up_read, &mut down_write, rules);
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        () = quiet => {}
    }
}

fn answer(status: u16, why: &str) -> Answer {
    let mut response = hyper::Response::new(Either::Right(Full::new(Bytes::from(format!(
        "SandBase egress: {why}\n"
    )))));
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl Session {
    /// One request of the sandbox's, answered by the upstream or by the proxy.
    async fn forward(&self, request: hyper::Request<Incoming>) -> Answer {
        let mut answer = self.exchange(request).await;
        if self.one_request && answer.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
            answer.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        answer
    }

    /// The phases of a request: check the host, strip proxy headers, inject credentials,
    /// scan the body, forward. A phase that refuses answers for the upstream.
    async fn exchange(&self, mut request: hyper::Request<Incoming>) -> Answer {
        let downstream_upgrade = request
            .headers()
            .contains_key(http::header::UPGRADE)
            .then(|| hyper::upgrade::on(&mut request));
        let (mut parts, body) = request.into_parts();
        let head = parts.method == http::Method::HEAD;
        let checked = check_method(&parts)
            .and_then(|()| self.check_host(&parts))
            .and_then(|()| strip_proxy_headers(&mut parts))
            .and_then(|()| self.inject(&mut parts));
        match checked {
            Ok(()) => {}
            Err(Refusal::Answer(status, why)) => return answer(status, &why),
            Err(Refusal::Leak(name)) => return self.stop_leak(name),
        }
        let leak = Arc::new(Mutex::new(None));
        let body = self.scan_body(body, &mut parts, &leak);
        let response = self
            .send(
                hyper::Request::from_parts(parts, body),
                downstream_upgrade,
                &leak,
            )
            .await;
        self.scrub_answer(response, head)
    }

    /// The names must agree: the request's host and port are the connection's, and it
    /// carries no credentials in its URL.
    fn check_host(&self, parts: &http::request::Parts) -> Result<(), Refusal> {
        // One Host, always: two could be read differently by the upstream and by whatever
        // fronts it.
        if parts.headers.get_all(http::header::HOST).iter().count() > 1 {
            return Err(Refusal::Answer(400, "more than one Host header".to_owned()));
        }
        // In absolute form the target's authority is the host (Host is rewritten from it).
        let authority = match parts.uri.authority() {
            Some(authority) => authority.as_str().to_owned(),
            None => parts
                .headers
                .get(http::header::HOST)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
                .ok_or_else(|| Refusal::Answer(400, "the request has no Host header".to_owned()))?,
        };
        if authority.contains('@') {
            return Err(Refusal::Answer(
                400,
                "credentials in the URL are not allowed".to_owned(),
            ));
        }
        let named = split_authority(&authority, self.port);
        let agrees = named
            .as_ref()
            .is_ok_and(|(host, port)| *host == self.host && *port == self.port);
        if agrees {
            Ok(())
        } else {
            Err(Refusal::Answer(
                421,
                format!(
                    "this connection is for {}:{}; a request for {authority} needs its own",
                    self.host, self.port
                ),
            ))
        }
    }

    /// Over TLS, the credentials bound to the host are added (a placeholder bound elsewhere
    /// stops the request); in plain text none are, and any placeholder stops it.
    fn inject(&self, parts: &mut http::request::Parts) -> Result<(), Refusal> {
        if let Some(access) = self.store.get() {
            access
                .prepare(parts)
                .map_err(|(status, why)| Refusal::Answer(status, why))?;
            let mut injected = self.injected.lock().unwrap_or_else(|p| p.into_inner());
            injected.insert(STORE_CREDENTIAL.to_owned());
            return Ok(());
        }
        let outcome = if self.tls {
            crate::credentials::apply(self.credentials(), &self.host, self.port, parts)
        } else {
            match crate::credentials::placeholder_in_plain(self.credentials(), parts) {
                Some(name) => Outcome::Leak(name),
                None => Outcome::Forward(Vec::new()),
            }
        };
        if self.scrub.is_some() {
            // What comes back is scrubbed: it must come back as it is, not compressed (nor
            // the frames of a WebSocket it may switch to).
            parts.headers.insert(
                http::header::ACCEPT_ENCODING,
                http::HeaderValue::from_static("identity"),
            );
            parts.headers.remove(http::header::SEC_WEBSOCKET_EXTENSIONS);
        }
        match outcome {
            Outcome::Leak(name) => Err(Refusal::Leak(name)),
            Outcome::Forward(names) => {
                if !names.is_empty() {
                    self.injected
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend(names);
                }
                Ok(())
            }
        }
    }

    /// With placeholders about, the body is read on its way too; a placeholder bound
    /// elsewhere is recorded in `leak` and ends the body.
    fn scan_body(
        &self,
        body: Incoming,
        parts: &mut http::request::Parts,
        leak: &Arc<Mutex<Option<String>>>,
    ) -> UpstreamBody {
        let scan = if self.tls {
            BodyScan::new(self.credentials(), &self.host, self.port, parts.uri.path())
        } else {
            BodyScan::plain(self.credentials())
        };
        let Some(scan) = scan else {
            return Either::Left(body);
        };
        let keeps_length = scan.keeps_length();
        if !keeps_length {
            // Its length changes with the swap: sent chunked instead.
            parts.headers.remove(http::header::CONTENT_LENGTH);
        }
        Either::Right(Filtered::new(body, scan, keeps_length, Arc::clone(leak)))
    }

    /// Forwards the request on the upstream connection and passes its answer on (relaying
    /// the connection when it switches protocols).
    async fn send(
        &self,
        request: hyper::Request<UpstreamBody>,
        downstream_upgrade: Option<hyper::upgrade::OnUpgrade>,
        leak: &Mutex<Option<String>>,
    ) -> Answer {
        if let Some(why) = self
            .problem
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return answer(502, &why);
        }
        let mut sender = self.sender.lock().await;
        let Some(sender) = sender.as_mut() else {
            return answer(502, "no upstream connection");
        };
        if sender.ready().await.is_err() {
            return answer(502, &format!("{} closed the connection", self.host));
        }
        let sent = sender.send_request(request).await;
        if let Some(name) = leak.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return self.stop_leak(name);
        }
        let mut response = match sent {
            Ok(response) => response,
            Err(error) => return answer(502, &format!("{}: {error}", self.host)),
        };
        if response.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
            let Some(downstream) = downstream_upgrade else {
                return answer(502, &format!("{} switched protocols unasked", self.host));
            };
            let upstream = hyper::upgrade::on(&mut response);
            let relay = tokio::spawn(relay_upgraded(
                Upgraded {
                    downstream,
                    upstream,
                    scrub: self.scrub.clone(),
                },
                Arc::clone(&self.counters),
                self.idle_timeout,
            ));
            *self.upgraded.lock().unwrap_or_else(|p| p.into_inner()) = Some(relay);
        } else if closes(&response) {
            response.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        response.map(|body| Either::Left(Either::Left(body)))
    }

    /// Over a connection that carries credentials, the upstream's answer is passed on only
    /// scrubbed of their values: its headers at once, its body as it streams. A compressed
    /// body (the request asked for identity) cannot be scrubbed and is refused.
    fn scrub_answer(&self, mut response: Answer, head: bool) -> Answer {
        let Some(rules) = &self.scrub else {
            return response;
        };
        rules.scrub_headers(response.headers_mut());
        // The reason phrase an upstream chose could quote a value too: the canonical one is
        // sent instead.
        response
            .extensions_mut()
            .remove::<hyper::ext::ReasonPhrase>();
        let encoded = response
            .headers()
            .get(http::header::CONTENT_ENCODING)
            .is_some_and(|coding| !coding.as_bytes().eq_ignore_ascii_case(b"identity"));
        let status = response.status();
        let bodiless = head
            || status.is_informational()
            || status == hyper::StatusCode::NO_CONTENT
            || status == hyper::StatusCode::NOT_MODIFIED;
        let (mut parts, body) = response.into_parts();
        match body {
            Either::Left(Either::Left(body)) if !bodiless => {
                if encoded {
                    return answer(
                        502,
                        &format!(
                            "{} answered with a compressed body although asked for identity; \
                             an answer on a connection that carries credentials is passed on \
                             only when it can be scrubbed",
                            self.host
                        ),
                    );
                }
                if !rules.keeps_length() {
                    parts.headers.remove(http::header::CONTENT_LENGTH);
                }
                let scrub = Scrub::new(Arc::clone(rules));
                let stopped = Arc::new(Mutex::new(None));
                let body = Filtered::new(body, scrub, rules.keeps_length(), stopped);
                hyper::Response::from_parts(parts, Either::Left(Either::Right(body)))
            }
            body => hyper::Response::from_parts(parts, body),
        }
    }

    /// Answers 403 for a request carrying another host's placeholder, and records it.
    fn stop_leak(&self, name: String) -> Answer {
        let why = if self.tls {
            format!(
                "the request carries the placeholder of credential `{name}`, which is not for {}; blocked",
                self.host
            )
        } else {
            format!(
                "the request carries the placeholder of credential `{name}`, which is only sent over HTTPS to its own hosts; blocked"
            )
        };
        let _ = self.flows.try_send(Flow {
            sandbox: self.sandbox.clone(),
            host: self.host.clone(),
            port: self.port,
            mode: if self.tls {
                "https"
            } else {
                self.mode.as_str()
            }
            .to_owned(),
            decision: Decision::Denied(why.clone()),
            intercepted: self.tls,
            credentials: Vec::new(),
            leak: Some(name),
            address: self.address,
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::ZERO,
            started_at: std::time::SystemTime::now(),
        });
        answer(403, &why)
    }
}

/// Why a phase refused a request: an answer of the proxy's, or a placeholder on its way to
/// a host it is not for.
enum Refusal {
    Answer(u16, String),
    Leak(String),
}

/// TRACE and TRACK echo the request back, credentials and all: refused.
fn check_method(parts: &http::request::Parts) -> Result<(), Refusal> {
    if parts.method == http::Method::TRACE || parts.method.as_str() == "TRACK" {
        return Err(Refusal::Answer(
            405,
            format!("{} is not allowed through SandBase's egress", parts.method),
        ));
    }
    Ok(())
}

/// Proxy headers are for the proxy; an absolute-form target becomes origin-form with its
/// authority as `Host`.
fn strip_proxy_headers(parts: &mut http::request::Parts) -> Result<(), Refusal> {
    let proxy_headers: Vec<http::HeaderName> = parts
        .headers
        .keys()
        .filter(|name| name.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxy_headers {
        parts.headers.remove(name);
    }
    let Some(authority) = parts.uri.authority() else {
        return Ok(());
    };
    match http::HeaderValue::from_str(authority.as_str()) {
        Ok(host) => parts.headers.insert(http::header::HOST, host),
        Err(_) => return Err(Refusal::Answer(400, "bad request target".to_owned())),
    };
    let origin = parts
        .uri
        .path_and_query()
        .map_or("/", |origin| origin.as_str())
        .to_owned();
    match origin.parse() {
        Ok(uri) => parts.uri = uri,
        Err(_) => return Err(Refusal::Answer(400, "bad request target".to_owned())),
    }
    Ok(())
}
