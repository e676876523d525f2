//! Reading what a connection asks for: a request head (CONNECT, absolute-form, or
//! origin-form with `Host`) or a TLS ClientHello, parsed by pure functions.

use std::net::IpAddr;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::sni::{self, Hello};

/// Largest request head read from a sandbox.
const MAX_HEAD: usize = 16 * 1024;

/// What a request head asked for.
pub(super) struct Target {
    pub(super) mode: &'static str,
    pub(super) host: String,
    pub(super) port: u16,
    /// Plain HTTP: served request by request (the others are tunnels or TLS).
    pub(super) plain: bool,
}

/// Reads until a whole ClientHello is in `buffer` (over as many records as it spans).
pub(super) async fn read_hello(
    stream: &mut TcpStream,
    buffer: &mut Vec<u8>,
) -> std::io::Result<Hello> {
    let mut chunk = [0u8; 4096];
    loop {
        match sni::parse(buffer) {
            Hello::Incomplete => {}
            other => return Ok(other),
        }
        if buffer.len() >= sni::MAX_HELLO {
            return Ok(Hello::NotTls);
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// Reads until the end of a request head; returns its length (bytes after it stay in
/// `buffer`).
pub(super) async fn read_head(
    stream: &mut TcpStream,
    buffer: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(end + 4);
        }
        if buffer.len() >= MAX_HEAD {
            return Err(std::io::Error::other("request head too large"));
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// `host` or `host:port` (IPv6 literals in brackets); the default port when absent.
pub(super) fn split_authority(authority: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{authority}` is not host:port"))?;
        let port = match after.strip_prefix(':') {
            Some(port) => port
                .parse()
                .map_err(|_| format!("bad port in `{authority}`"))?,
            None => default_port,
        };
        (host.to_owned(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (
                host.to_owned(),
                port.parse()
                    .map_err(|_| format!("bad port in `{authority}`"))?,
            ),
            None => (authority.to_owned(), default_port),
        }
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() || port == 0 {
        return Err(format!("`{authority}` is not host:port"));
    }
    if host.parse::<IpAddr>().is_ok() {
        return Err(format!(
            "{host}: IP addresses are not allowed, only host names the policy allows"
        ));
    }
    Ok((host, port))
}

/// What a request head asks for: on the explicit listener (`redirected` = `None`) a CONNECT
/// or an absolute-form request; redirected from port N, an origin-form request whose host is
/// its `Host` (which must not name another port).
pub(super) fn parse_target(head: &[u8], redirected: Option<u16>) -> Result<Target, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err("malformed request".to_owned()),
    }
    let method = request.method.unwrap_or_default();
    let path = request.path.unwrap_or_default();
    let host_header = request
        .headers
        .iter()
        .find(|header| header.name.eq_ignore_ascii_case("host"))
        .and_then(|header| std::str::from_utf8(header.value).ok())
        .map(str::to_owned);
    if let Some(port) = redirected {
        if method == "CONNECT" || !path.starts_with('/') {
            return Err("expected an origin-form request (GET /path)".to_owned());
        }
        let authority = host_header.ok_or_else(|| "a Host header is required".to_owned())?;
        let (host, named_port) = split_authority(&authority, port)?;
        if named_port != port {
            return Err(format!(
                "the Host header names port {named_port}, the connection is to port {port}"
            ));
        }
        return Ok(Target {
            mode: "transparent-http",
            host,
            port,
            plain: true,
        });
    }
    if method == "CONNECT" {
        let (host, port) = split_authority(path, 443)?;
        if let Some(header) = host_header {
            let (named, _) = split_authority(&header, port)?;
            if named != host {
                return Err(format!(
                    "the Host header ({named}) does not match the CONNECT target ({host})"
                ));
            }
        }
        return Ok(Target {
            mode: "connect",
            host,
            port,
            plain: false,
        });
    }
    let rest = path
        .strip_prefix("http://")
        .ok_or_else(|| "only absolute http:// requests and CONNECT are proxied".to_owned())?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("credentials in the URL are not allowed".to_owned());
    }
    let (host, port) = split_authority(authority, 80)?;
    if let Some(header) = &host_header {
        let (named, _) = split_authority(header, port)?;
        if named != host {
            return Err(format!(
                "the Host header ({named}) does not match the request target ({host})"
            ));
        }
    }
    Ok(Target {
        mode: "http",
        host,
        port,
        plain: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirected_requests_are_named_by_their_host_header() {
        let get = parse_target(
            b"GET /x HTTP/1.1\r\nHost: Api.Example.com\r\nConnection: keep-alive\r\n\r\n",
            Some(80),
        )
        .unwrap();
        assert_eq!(
            (get.mode, get.host.as_str(), get.port),
            ("transparent-http", "api.example.com", 80)
        );
        assert!(get.plain);
        for bad in [
            &b"GET /x HTTP/1.1\r\n\r\n"[..],
            b"GET /x HTTP/1.1\r\nHost: api.example.com:8080\r\n\r\n",
            b"GET /x HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n",
            b"GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
            b"CONNECT api.example.com:443 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                parse_target(bad, Some(80)).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn targets_are_read_from_connect_and_absolute_requests() {
        let connect = parse_target(
            b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n",
            None,
        )
        .unwrap();
        assert_eq!(
            (connect.mode, connect.host.as_str(), connect.port),
            ("connect", "api.example.com", 443)
        );
        let get = parse_target(
            b"GET http://Example.org/a?b=1 HTTP/1.1\r\nHost: example.org\r\nProxy-Authorization: x\r\nConnection: keep-alive\r\n\r\n",
            None,
        )
        .unwrap();
        assert_eq!(
            (get.host.as_str(), get.port, get.plain),
            ("example.org", 80, true)
        );
        assert!(!connect.plain);
        for bad in [
            &b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n"[..],
            b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
            b"CONNECT a.example.com:443 HTTP/1.1\r\nHost: b.example.com\r\n\r\n",
            b"GET http://a.example.com/ HTTP/1.1\r\nHost: b.example.com\r\n\r\n",
            b"GET http://user:pw@a.example.com/ HTTP/1.1\r\n\r\n",
            b"GET /relative HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
            b"GET https://a.example.com/ HTTP/1.1\r\n\r\n",
            b"CONNECT a.example.com:0 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                parse_target(bad, None).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
