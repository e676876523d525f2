//! The server name of a TLS ClientHello (the `server_name` extension), read from the first
//! handshake record without answering it.

/// What the bytes so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not a whole record yet.
    Incomplete,
    /// A ClientHello naming this host (lowercase, no trailing dot).
    Name(String),
    /// A ClientHello without a server name.
    NoName,
    /// Not a TLS ClientHello.
    NotTls,
}

/// Largest record accepted (TLS caps plaintext records at 16 KiB).
pub const MAX_RECORD: usize = 5 + 16 * 1024 + 256;

pub fn parse(bytes: &[u8]) -> Hello {
    if bytes.is_empty() {
        return Hello::Incomplete;
    }
    if bytes[0] != 0x16 {
        return Hello::NotTls;
    }
    if bytes.len() < 5 {
        return Hello::Incomplete;
    }
    let length = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
    if 5 + length > MAX_RECORD {
        return Hello::NotTls;
    }
    if bytes.len() < 5 + length {
        return Hello::Incomplete;
    }
    client_hello(&bytes[5..5 + length]).unwrap_or(Hello::NotTls)
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < count {
            return None;
        }
        let (head, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn vector8(&mut self) -> Option<&'a [u8]> {
        let length = self.u8()?;
        self.take(length)
    }

    fn vector16(&mut self) -> Option<&'a [u8]> {
        let length = self.u16()?;
        self.take(length)
    }
}

fn client_hello(record: &[u8]) -> Option<Hello> {
    let mut reader = Reader { bytes: record };
    if reader.u8()? != 1 {
        return Some(Hello::NotTls);
    }
    let length = reader.take(3)?;
    let length =
        (usize::from(length[0]) << 16) | (usize::from(length[1]) << 8) | usize::from(length[2]);
    // A ClientHello split over several records is not read further: no name.
    let body = reader.take(length.min(reader.bytes.len()))?;
    let mut hello = Reader { bytes: body };
    hello.take(2 + 32)?; // version, random
    hello.vector8()?; // session id
    hello.vector16()?; // cipher suites
    hello.vector8()?; // compression methods
    let Some(extensions) = hello.vector16() else {
        return Some(Hello::NoName);
    };
    let mut extensions = Reader { bytes: extensions };
    while !extensions.bytes.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vector16()?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader { bytes: data };
        let mut names = Reader {
            bytes: list.vector16()?,
        };
        while !names.bytes.is_empty() {
            let name_type = names.u8()?;
            let name = names.vector16()?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Hello::Name(name.trim_end_matches('.').to_ascii_lowercase()));
            }
        }
    }
    Some(Hello::NoName)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as rustls sends it for `name`.
    fn hello(name: &str) -> Vec<u8> {
        use std::io::Write as _;
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut client = rustls::ClientConnection::new(
            std::sync::Arc::new(config),
            rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap(),
        )
        .unwrap();
        let mut out = Vec::new();
        client.write_tls(&mut out).unwrap();
        out.flush().unwrap();
        out
    }

    #[test]
    fn the_name_is_read_from_a_real_client_hello() {
        let bytes = hello("API.Example.com");
        assert_eq!(parse(&bytes), Hello::Name("api.example.com".to_owned()));
        for cut in [0, 3, 5, bytes.len() - 1] {
            assert_eq!(parse(&bytes[..cut]), Hello::Incomplete, "cut at {cut}");
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        let mut garbage = bytes.clone();
        garbage[5] = 2;
        assert_eq!(parse(&garbage), Hello::NotTls);
    }
}
