//! Connections to a URL a team names (a remote MCP server an agent run uses): through the
//! egress crate's SSRF guard, as a sandbox's traffic is. The name is resolved here, every
//! address it resolves to is checked (one internal address refuses the name: a rebinding
//! answer cannot slip one in), and the client dials exactly the addresses checked; an address
//! in the URL is checked before every use. No proxy from the environment, no redirect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use sandbase_egress::ssrf::{self, Cidr};

/// Where a team's URLs may not lead besides the guard's own refusals: the gateway's own
/// listeners and the networks the operator denies.
#[derive(Clone, Debug, Default)]
pub struct Guard {
    pub node: Vec<IpAddr>,
    pub denied: Vec<Cidr>,
}

impl Guard {
    /// The guard as the settings draw it.
    pub fn from_settings(settings: &crate::config::Settings) -> Guard {
        let listeners = [settings.server.listen, settings.server.internal_listen];
        Guard {
            node: listeners
                .iter()
                .map(SocketAddr::ip)
                .filter(|address| !address.is_unspecified())
                .collect(),
            denied: settings.harness.denied_networks.clone(),
        }
    }
}

/// A URL a team named, parsed and checked for its form (`http` or `https`, a host, no
/// user or password).
pub fn parse(text: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(text).map_err(|error| format!("not a URL: {error}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "the scheme `{}` is not http or https",
            url.scheme()
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a user or password in the URL is not allowed".to_owned());
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".to_owned());
    }
    Ok(url)
}

impl Guard {
    fn check(&self, address: IpAddr) -> Result<(), String> {
        ssrf::check(address, &self.node, &self.denied)
            .map_err(|blocked| format!("{address} is {}", blocked.as_str()))
    }

    /// `host`'s addresses when every one of them may be reached.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(address) = host.parse::<IpAddr>() {
            self.check(address)?;
            return Ok(vec![SocketAddr::new(address, port)]);
        }
        let found: Vec<SocketAddr> = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::lookup_host((host, port)),
        )
        .await
        .map_err(|_| format!("resolving `{host}` took too long"))?
        .map_err(|error| format!("`{host}` does not resolve: {error}"))?
        .collect();
        if found.is_empty() {
            return Err(format!("`{host}` has no address"));
        }
        for address in &found {
            self.check(address.ip())
                .map_err(|why| format!("`{host}` resolves to {why}"))?;
        }
        Ok(found)
    }

    /// Checks `url`'s host as a connection to it would be (a name: resolved now, and again by
    /// the client at each connection).
    pub async fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        let port = url.port_or_known_default().unwrap_or(443);
        self.resolve(url.host_str().unwrap_or_default(), port)
            .await
            .map(|_| ())
    }

    /// Checks `url`'s host when it is an address, which a client dials without resolving it
    /// (a name is checked by the client's resolver, this guard, at each connection).
    pub fn check_address(&self, url: &reqwest::Url) -> Result<(), String> {
        let host = url.host_str().unwrap_or_default();
        match host.trim_start_matches('[').trim_end_matches(']').parse() {
            Ok(address) => self.check(address),
            Err(_) => Ok(()),
        }
    }

    /// A client that resolves through this guard, carrying `headers` on every request.
    pub fn client(&self, headers: reqwest::header::HeaderMap) -> reqwest::Result<reqwest::Client> {
        reqwest::Client::builder()
            .default_headers(headers)
            .dns_resolver(Arc::new(self.clone()))
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .build()
    }
}

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.clone();
        Box::pin(async move {
            let addresses = guard
                .resolve(name.as_str(), 0)
                .await
                .map_err(|why| -> Box<dyn std::error::Error + Send + Sync> { why.into() })?;
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn internal_and_metadata_addresses_and_names_for_them_are_refused() {
        let guard = Guard::default();
        for url in [
            "http://127.0.0.1:8081/internal",
            "http://169.254.169.254/latest/meta-data",
            "http://localhost:9/",
            "http://[::ffff:127.0.0.1]/",
            "http://10.1.2.3/",
        ] {
            let parsed = parse(url).expect(url);
            assert!(guard.check_url(&parsed).await.is_err(), "{url}");
        }
        let literal = parse("http://[::ffff:127.0.0.1]:9/").expect("url");
        assert!(guard.check_address(&literal).is_err());
        let public = parse("http://203.0.113.9:8080/mcp").expect("url");
        assert!(guard.check_address(&public).is_ok());
        assert!(guard.check_url(&public).await.is_ok());
        let denied = Guard {
            node: Vec::new(),
            denied: vec![Cidr::parse("203.0.113.0/24").expect("cidr")],
        };
        assert!(denied.check_url(&public).await.is_err());
    }

    #[test]
    fn only_plain_http_urls_without_a_password() {
        assert!(parse("file:///etc/passwd").is_err());
        assert!(parse("http://user:pw@example.com/").is_err());
        assert!(parse("https://mcp.example.com/mcp").is_ok());
    }
}
