//! The client's address: the connection's peer, or — when the peer is one of the configured
//! trusted proxies — the rightmost `X-Forwarded-For` address that is not itself a trusted
//! proxy. Addresses a client writes into the header for itself sit left of what its proxies
//! append, so they are never taken.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts, Request};
use axum::http::request::Parts;

use crate::config::Cidr;
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
            &state.settings.server.trusted_proxies,
        )))
    }
}

/// The address of a request (for the layers that see the whole request).
pub fn client_ip(request: &Request, trusted_proxies: &[Cidr]) -> Option<IpAddr> {
    address(
        request.headers(),
        request.extensions().get::<ConnectInfo<SocketAddr>>(),
        trusted_proxies,
    )
}

fn address(
    headers: &axum::http::HeaderMap,
    peer: Option<&ConnectInfo<SocketAddr>>,
    trusted_proxies: &[Cidr],
) -> Option<IpAddr> {
    let peer = peer.map(|info| info.0.ip())?;
    let trusted = |address: &IpAddr| trusted_proxies.iter().any(|cidr| cidr.contains(*address));
    if !trusted(&peer) {
        return Some(peer);
    }
    let mut client = peer;
    // Every header line, in order, is one list; walk it from the right.
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .collect();
    for hop in hops.iter().rev() {
        let Ok(address) = hop.trim().parse::<IpAddr>() else {
            // Garbage from the right of the chain: the last good address is the client.
            break;
        };
        client = address;
        if !trusted(&address) {
            break;
        }
    }
    Some(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(peer: &str, forwarded: &[&str], trusted: &[&str]) -> IpAddr {
        let mut headers = axum::http::HeaderMap::new();
        for value in forwarded {
            headers.append("x-forwarded-for", value.parse().unwrap());
        }
        let trusted: Vec<Cidr> = trusted.iter().map(|cidr| cidr.parse().unwrap()).collect();
        let peer = ConnectInfo(SocketAddr::new(peer.parse().unwrap(), 1234));
        address(&headers, Some(&peer), &trusted).unwrap()
    }

    #[test]
    fn the_header_counts_only_from_a_trusted_peer() {
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        // Nobody trusted: the header is the client's own words.
        assert_eq!(resolve("203.0.113.9", &["1.2.3.4"], &[]), ip("203.0.113.9"));
        // A trusted balancer appended the real client; what the client wrote is ignored.
        assert_eq!(
            resolve("10.0.0.2", &["1.2.3.4, 198.51.100.7"], &["10.0.0.0/8"]),
            ip("198.51.100.7")
        );
        // Two trusted hops, on two header lines.
        assert_eq!(
            resolve(
                "10.0.0.2",
                &["1.2.3.4, 198.51.100.7", "10.0.0.3"],
                &["10.0.0.0/8"]
            ),
            ip("198.51.100.7")
        );
        // An untrusted peer claiming to forward is the client itself.
        assert_eq!(
            resolve("198.51.100.7", &["10.0.0.3"], &["10.0.0.0/8"]),
            ip("198.51.100.7")
        );
        // Garbage right of the trusted chain stops the walk.
        assert_eq!(
            resolve("10.0.0.2", &["1.2.3.4, nonsense"], &["10.0.0.0/8"]),
            ip("10.0.0.2")
        );
        assert_eq!(
            resolve("::1", &["2001:db8::5"], &["::1/128"]),
            ip("2001:db8::5")
        );
    }
}
