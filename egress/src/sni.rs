//! The server name of a TLS ClientHello (the `server_name` extension), read without
//! answering it: the handshake message is reassembled from as many records as it spans (a
//! client may split it to slip past a reader of the first record only), and one offering
//! Encrypted Client Hello (whose real name is hidden) is told apart.

/// What the bytes so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not a whole record yet.
    Incomplete,
    /// A ClientHello naming this host (lowercase, no trailing dot).
    Name(String),
    /// A ClientHello without a server name.
    NoName,
    /// A ClientHello offering Encrypted Client Hello (or its ESNI draft): the name it shows
    /// is not the one it will use.
    Encrypted,
    /// Not a TLS ClientHello.
    NotTls,
}

/// Largest record accepted (TLS caps plaintext records at 16 KiB).
pub const MAX_RECORD: usize = 5 + 16 * 1024 + 256;
/// Largest ClientHello accepted (with its record headers): post-quantum key shares make
/// them a few KiB; nothing legitimate comes near this.
pub const MAX_HELLO: usize = 64 * 1024;

/// The extension types of Encrypted Client Hello and of its predecessor, ESNI.
const ECH_EXTENSIONS: [usize; 2] = [0xfe0d, 0xffce];

pub fn parse(bytes: &[u8]) -> Hello {
    let mut handshake = Vec::new();
    let mut at = 0;
    loop {
        let Some(&kind) = bytes.get(at) else {
            return Hello::Incomplete;
        };
        if kind != 0x16 {
            return Hello::NotTls;
        }
        let Some(header) = bytes.get(at..at + 5) else {
            return Hello::Incomplete;
        };
        let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if length == 0 || 5 + length > MAX_RECORD || at + 5 + length > MAX_HELLO {
            return Hello::NotTls;
        }
        let Some(fragment) = bytes.get(at + 5..at + 5 + length) else {
            return Hello::Incomplete;
        };
        handshake.extend_from_slice(fragment);
        at += 5 + length;
        if handshake.len() < 4 {
            continue;
        }
        if handshake[0] != 1 {
            return Hello::NotTls;
        }
        let needed = 4
            + ((usize::from(handshake[1]) << 16)
                | (usize::from(handshake[2]) << 8)
                | usize::from(handshake[3]));
        if handshake.len() >= needed {
            return client_hello(&handshake[4..needed]).unwrap_or(Hello::NotTls);
        }
    }
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

/// The ClientHello's body (after its type and length).
fn client_hello(body: &[u8]) -> Option<Hello> {
    let mut hello = Reader { bytes: body };
    hello.take(2 + 32)?; // version, random
    hello.vector8()?; // session id
    hello.vector16()?; // cipher suites
    hello.vector8()?; // compression methods
    let Some(extensions) = hello.vector16() else {
        return Some(Hello::NoName);
    };
    let mut extensions = Reader { bytes: extensions };
    let mut found = Hello::NoName;
    while !extensions.bytes.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vector16()?;
        if ECH_EXTENSIONS.contains(&kind) {
            return Some(Hello::Encrypted);
        }
        if kind == 0 && found == Hello::NoName {
            found = server_name(data)?;
        }
    }
    Some(found)
}

/// The host name in a `server_name` extension's data.
fn server_name(data: &[u8]) -> Option<Hello> {
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

    /// The same handshake message cut into records of `size` bytes.
    fn split(bytes: &[u8], size: usize) -> Vec<u8> {
        let message = &bytes[5..];
        let mut records = Vec::new();
        for piece in message.chunks(size) {
            records.extend_from_slice(&[0x16, bytes[1], bytes[2]]);
            records.extend_from_slice(&u16::try_from(piece.len()).unwrap().to_be_bytes());
            records.extend_from_slice(piece);
        }
        records
    }

    #[test]
    fn a_hello_split_across_records_is_reassembled() {
        let bytes = hello("fronted.example.com");
        for size in [1, 3, 50, 200] {
            let records = split(&bytes, size);
            assert_eq!(
                parse(&records),
                Hello::Name("fronted.example.com".to_owned()),
                "records of {size}"
            );
            assert_eq!(parse(&records[..records.len() - 1]), Hello::Incomplete);
        }
        // A record of another type in the middle: not a ClientHello.
        let mut records = split(&bytes, 100);
        records[105] = 0x17;
        assert_eq!(parse(&records), Hello::NotTls);
        // A claimed length past the cap is refused, not waited for.
        let mut huge = bytes.clone();
        huge[6..9].copy_from_slice(&[0x01, 0x00, 0x00]);
        assert_eq!(parse(&split(&huge, 16_000)), Hello::Incomplete);
        let mut records = Vec::new();
        for _ in 0..5 {
            records.extend_from_slice(&[0x16, 3, 1, 0x3e, 0x80]);
            records.extend_from_slice(&[0u8; 16_000]);
        }
        records[5] = 1;
        records[6..9].copy_from_slice(&[0x01, 0x00, 0x00]);
        assert_eq!(parse(&records), Hello::NotTls);
    }

    #[test]
    fn an_encrypted_client_hello_is_told_apart() {
        let bytes = hello("public.example.com");
        // Append an ECH extension (type 0xfe0d, empty data) to the extensions.
        let mut message = bytes[9..].to_vec();
        let mut reader = Reader { bytes: &message };
        reader.take(2 + 32).unwrap();
        reader.vector8().unwrap();
        reader.vector16().unwrap();
        reader.vector8().unwrap();
        let extensions_at = message.len() - reader.bytes.len();
        let length = usize::from(u16::from_be_bytes([
            message[extensions_at],
            message[extensions_at + 1],
        ]));
        message.extend_from_slice(&[0xfe, 0x0d, 0x00, 0x00]);
        message[extensions_at..extensions_at + 2]
            .copy_from_slice(&u16::try_from(length + 4).unwrap().to_be_bytes());
        let mut handshake = vec![1u8];
        handshake.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes()[1..]);
        handshake.extend_from_slice(&message);
        let mut record = vec![0x16, 3, 1];
        record.extend_from_slice(&u16::try_from(handshake.len()).unwrap().to_be_bytes());
        record.extend_from_slice(&handshake);
        assert_eq!(parse(&record), Hello::Encrypted);
    }
}
