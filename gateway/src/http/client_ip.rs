//! The client's address: the connection's peer, or the first `X-Forwarded-For` address
//! when the gateway is configured to trust it (behind a proxy it trusts).

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts, Request};
use axum::http::request::Parts;

use crate::error::ApiError;
use crate::state::AppState;

/// The caller's address, when known.
pub struct ClientIp(pub Option<IpAddr>);

impl FromRequestParts<AppState> for ClientIp {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Ok(ClientIp(address(
            &parts.headers,
            parts.extensions.get::<ConnectInfo<SocketAddr>>(),
            state.settings.server.trust_forwarded_for,
        )))
    }
}

/// The address of a request (for the audit layer, which sees the whole request).
pub fn client_ip(request: &Request, trust_forwarded_for: bool) -> Option<IpAddr> {
    address(
        request.headers(),
        request.extensions().get::<ConnectInfo<SocketAddr>>(),
        trust_forwarded_for,
    )
}

fn address(
    headers: &axum::http::HeaderMap,
    peer: Option<&ConnectInfo<SocketAddr>>,
    trust_forwarded_for: bool,
) -> Option<IpAddr> {
    if trust_forwarded_for
        && let Some(forwarded) = headers
            .get("x-forwarded-for")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(',').next())
            .and_then(|value| value.trim().parse().ok())
    {
        return Some(forwarded);
    }
    peer.map(|info| info.0.ip())
}
