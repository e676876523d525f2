//! Preview hosts (`{port}-{sandbox_id}.{previews.domain}`): a request whose `Host` names one
//! never reaches the API. It is admitted by the preview's token, a signed URL (traded here for
//! a cookie of that host and a redirect to the plain URL) or the preview being public; then
//! the sandbox's worker opens a connection to the port inside the sandbox, and this side
//! speaks HTTP/1.1 over it: the request passes on without SandBase's own token and cookie,
//! the answer streams back, and an upgrade (a dev server's WebSocket) is carried both ways.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use hyper_util::rt::TokioIo;
use sandbase_api::previews::{
    PREVIEW_COOKIE, PREVIEW_COOKIE_SECURE, PREVIEW_SIGNATURE_PARAM, PREVIEW_TOKEN_HEADER,
};

use crate::error::{ApiError, ApiResult};
use crate::sandboxes::forward;
use crate::sandboxes::preview_budget::{Full, Slot};
use crate::sandboxes::previews::{self, Admitted, Presented, PreviewRow, Target};
use crate::state::AppState;

/// Serves requests to preview hosts; passes every other request on.
pub async fn middleware(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let target = state
        .settings
        .previews
        .domain
        .as_deref()
        .and_then(|domain| {
            request
                .headers()
                .get(header::HOST)
                .and_then(|host| host.to_str().ok())
                .and_then(|host| previews::parse_host(host, domain))
        });
    match target {
        None => next.run(request).await,
        Some(target) => match serve(&state, target, request).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        },
    }
}

async fn serve(state: &AppState, target: Target, mut request: Request) -> ApiResult<Response> {
    let preview = previews::find(state, target)
        .await?
        .ok_or(ApiError::NotFound("preview"))?;
    let ip = super::client_ip::client_ip(&request, &state.settings.server.trusted_proxies);
    if let Some(signature) = query_value(request.uri(), PREVIEW_SIGNATURE_PARAM) {
        let expires = previews::signature_valid(state, &preview, &signature)
            .ok_or_else(|| failed_credential(state, ip))?;
        return Ok(trade_for_cookie(state, request.uri(), &signature, expires));
    }
    let cookie_name = cookie_name(&state.settings.previews.scheme);
    let cookie = cookie_value(request.headers(), cookie_name);
    let presented = Presented {
        token: request
            .headers()
            .get(PREVIEW_TOKEN_HEADER)
            .and_then(|value| value.to_str().ok()),
        signature: cookie.as_deref(),
    };
    let presented_any = presented.token.is_some() || presented.signature.is_some();
    let admitted = previews::admits(state, &preview, &presented).ok_or_else(|| {
        if presented_any {
            failed_credential(state, ip)
        } else {
            ApiError::PreviewUnauthorized
        }
    })?;
    if admitted == Admitted::Cookie && !own_request(state, &target, request.headers()) {
        return Err(ApiError::PreviewCrossSite);
    }
    strip_credentials(request.headers_mut(), cookie_name);
    let slot = state
        .sandboxes
        .preview_budget
        .enter(target.sandbox, target.port)
        .map_err(|full| {
            metrics::counter!("sandbase_preview_busy_total").increment(1);
            ApiError::PreviewBusy(match full {
                Full::Gateway => {
                    "this gateway holds as many preview connections as it may: retry shortly"
                        .to_owned()
                }
                Full::Sandbox => {
                    "this sandbox's previews hold as many connections as they may: close some"
                        .to_owned()
                }
                Full::Preview => format!(
                    "port {} holds as many preview connections as it may: close some",
                    target.port
                ),
            })
        })?;
    let worker = forward::route(state, preview.team_id, target.sandbox).await?;
    let stream = state
        .sandboxes
        .worker_client
        .open_port(&worker, target.sandbox, target.port)
        .await?;
    let idle = std::time::Duration::from_secs(state.settings.previews.idle_timeout_secs.max(1));
    relay(&preview, request, stream, slot, idle).await
}

/// A preview token or signature that opened nothing counts against its address's failed
/// authentications like a bad key (guessing tokens is guessing keys); an address that has
/// spent them gets 429.
fn failed_credential(state: &AppState, ip: Option<std::net::IpAddr>) -> ApiError {
    let Some(ip) = ip else {
        return ApiError::PreviewUnauthorized;
    };
    let shut_out = state.auth.ip_guard.may_fail(ip).err();
    state.auth.ip_guard.failed(ip);
    match shut_out {
        Some(retry_after_secs) => ApiError::RateLimited { retry_after_secs },
        None => ApiError::PreviewUnauthorized,
    }
}

/// The preview cookie's name: `__Host-` prefixed over https (the browser then keeps it to
/// this very host, `Secure`, path `/`, never set by a sibling domain).
fn cookie_name(scheme: &str) -> &'static str {
    if scheme == "https" {
        PREVIEW_COOKIE_SECURE
    } else {
        PREVIEW_COOKIE
    }
}

/// Whether a request carrying the preview's cookie is the preview's own doing, not another
/// site's (every preview is a site of the previews' domain, and a browser sends the cookie
/// with whatever any page asks of this host). A WebSocket must come from the preview's own
/// origin; anything else must be the preview's own (`Sec-Fetch-Site: same-origin`), typed
/// or bookmarked (`none`), or a top-level navigation (a link followed from any site). A
/// client that sends neither header (not a browser) rides nobody's cookie.
fn own_request(state: &AppState, target: &Target, headers: &HeaderMap) -> bool {
    let value = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if headers.contains_key(header::UPGRADE) {
        return match value("origin") {
            None => true,
            Some(origin) => origin_is_own(state, target, origin, value("host")),
        };
    }
    match value("sec-fetch-site") {
        None | Some("same-origin" | "none") => true,
        Some(_) => {
            value("sec-fetch-mode") == Some("navigate")
                && value("sec-fetch-dest") == Some("document")
        }
    }
}

/// Whether `origin` is the preview's own: its scheme and the host it was asked by.
fn origin_is_own(state: &AppState, target: &Target, origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let own = format!("{}://{host}", state.settings.previews.scheme);
    let named = host.split(':').next().and_then(|name| {
        state
            .settings
            .previews
            .domain
            .as_deref()
            .and_then(|domain| previews::parse_host(name, domain))
    });
    named.is_some_and(|named| named.sandbox == target.sandbox && named.port == target.port)
        && origin.eq_ignore_ascii_case(&own)
}

/// Speaks HTTP/1.1 to the sandbox's server over `stream`, and carries an upgrade both ways
/// until it ends or stays idle for `idle`. `slot` is held while the answer streams, or for
/// as long as the upgraded connection lasts.
async fn relay(
    preview: &PreviewRow,
    mut request: Request,
    stream: reqwest::Upgraded,
    slot: Slot,
    idle: std::time::Duration,
) -> ApiResult<Response> {
    let failed = |error: hyper::Error| {
        ApiError::PreviewFailed(format!(
            "the server on port {} in the sandbox did not answer ({error})",
            preview.port
        ))
    };
    let client_upgrade = request
        .headers()
        .contains_key(header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut request));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(failed)?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(error = %error, "a preview connection ended");
        }
    });
    let mut response = sender.send_request(request).await.map_err(failed)?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let upstream = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, upstream) {
                Ok((client, upstream)) => {
                    pipe_until_idle(TokioIo::new(client), TokioIo::new(upstream), idle).await;
                }
                Err(error) => tracing::debug!(error = %error, "a preview upgrade failed"),
            }
            drop(slot);
        });
        return Ok(response.map(|_| Body::empty()));
    }
    // The slot goes when the answer's body has been sent (or dropped).
    let (parts, body) = response.into_parts();
    let body = futures_util::StreamExt::map(
        http_body_util::BodyExt::into_data_stream(body),
        move |chunk| {
            let _held = &slot;
            chunk
        },
    );
    let mut response = Response::from_parts(parts, Body::from_stream(body));
    response
        .headers_mut()
        .entry(header::REFERRER_POLICY)
        .or_insert(HeaderValue::from_static("no-referrer"));
    Ok(response)
}

/// Carries bytes both ways until either side ends or nothing moves for `idle`.
async fn pipe_until_idle<A, B>(mut client: A, mut upstream: B, idle: std::time::Duration)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut from_client, mut from_upstream) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut from_client) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => if upstream.write_all(&from_client[..n]).await.is_err() { break },
            },
            read = upstream.read(&mut from_upstream) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => if client.write_all(&from_upstream[..n]).await.is_err() { break },
            },
            () = tokio::time::sleep(idle) => {
                metrics::counter!("sandbase_preview_idle_closed_total").increment(1);
                break;
            }
        }
    }
    let _ = client.shutdown().await;
    let _ = upstream.shutdown().await;
}

/// A redirect to the same URL without the signature, leaving the signature as a cookie of
/// the preview's host until it expires.
fn trade_for_cookie(
    state: &AppState,
    uri: &Uri,
    signature: &str,
    expires: DateTime<Utc>,
) -> Response {
    let path = uri.path();
    let rest: Vec<&str> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| {
            !pair.is_empty() && !pair.starts_with(&format!("{PREVIEW_SIGNATURE_PARAM}="))
        })
        .collect();
    let location = if rest.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", rest.join("&"))
    };
    let max_age = (expires - Utc::now()).num_seconds().max(0);
    let secure = if state.settings.previews.scheme == "https" {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{}={signature}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}",
        cookie_name(&state.settings.previews.scheme)
    );
    let mut response = StatusCode::TEMPORARY_REDIRECT.into_response();
    let headers = response.headers_mut();
    if let (Ok(location), Ok(cookie)) = (
        HeaderValue::from_str(&location),
        HeaderValue::from_str(&cookie),
    ) {
        headers.insert(header::LOCATION, location);
        headers.insert(header::SET_COOKIE, cookie);
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    response
}

/// The value of query parameter `name`, if present (signatures need no decoding).
fn query_value(uri: &Uri, name: &str) -> Option<String> {
    uri.query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_owned)
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key == name).then(|| value.to_owned())
        })
}

/// SandBase's own token header and cookie never reach the sandbox.
fn strip_credentials(headers: &mut HeaderMap, cookie_name: &str) {
    headers.remove(PREVIEW_TOKEN_HEADER);
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .map(str::trim)
        .filter(|pair| {
            !pair.is_empty()
                && pair
                    .split_once('=')
                    .is_none_or(|(key, _)| key != cookie_name)
        })
        .map(str::to_owned)
        .collect();
    headers.remove(header::COOKIE);
    if !kept.is_empty()
        && let Ok(value) = HeaderValue::from_str(&kept.join("; "))
    {
        headers.insert(header::COOKIE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preview_cookie_and_token_are_taken_out_and_other_cookies_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(PREVIEW_TOKEN_HEADER, HeaderValue::from_static("sbp_x"));
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; sandbase_preview=123.sig"),
        );
        headers.append(header::COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(
            cookie_value(&headers, PREVIEW_COOKIE).as_deref(),
            Some("123.sig")
        );
        strip_credentials(&mut headers, PREVIEW_COOKIE);
        assert!(headers.get(PREVIEW_TOKEN_HEADER).is_none());
        assert_eq!(headers.get(header::COOKIE).unwrap(), "a=1; b=2");
        let mut only = HeaderMap::new();
        only.insert(
            header::COOKIE,
            HeaderValue::from_static("sandbase_preview=1.s"),
        );
        strip_credentials(&mut only, PREVIEW_COOKIE);
        assert!(only.get(header::COOKIE).is_none());
    }

    #[test]
    fn over_https_the_cookie_is_kept_to_the_previews_own_host() {
        assert_eq!(cookie_name("https"), "__Host-sandbase_preview");
        assert_eq!(cookie_name("http"), PREVIEW_COOKIE);
    }

    #[test]
    fn the_signature_parameter_is_found_by_its_exact_name() {
        let uri: Uri = "/app/?x=1&sandbase_preview=99.abc&y=2".parse().unwrap();
        assert_eq!(
            query_value(&uri, PREVIEW_SIGNATURE_PARAM).as_deref(),
            Some("99.abc")
        );
        let other: Uri = "/?sandbase_previewx=1".parse().unwrap();
        assert_eq!(query_value(&other, PREVIEW_SIGNATURE_PARAM), None);
    }
}
