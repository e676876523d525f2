//! The node's DNS responder for sandboxes (UDP; nftables redirects their port 53 here). It
//! answers a sandbox only for names its policy allows — resolved by the proxy's resolver and
//! passed through the SSRF guard — and NXDOMAIN for every other name, so DNS carries nothing
//! out: the query never leaves the node unless the name is allowed. Refusals are flows.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use crate::proxy::{Decision, Flow, Registry, Resolver};
use crate::ssrf;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
/// Seconds answers may be cached: short, so policy changes show soon.
const TTL: u32 = 30;
/// Queries being answered at once, all sandboxes together.
const MAX_OUTSTANDING: usize = 1024;

const NOERROR: u8 = 0;
const FORMERR: u8 = 1;
const SERVFAIL: u8 = 2;
const NXDOMAIN: u8 = 3;
const REFUSED: u8 = 5;

/// A parsed query: its id, flags, the name (lowercase, no trailing dot), the type, and where
/// the question ends.
#[derive(Debug, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    pub flags: u16,
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    question_end: usize,
}

pub fn parse_query(packet: &[u8]) -> Option<Query> {
    if packet.len() < 12 {
        return None;
    }
    let id = u16::from_be_bytes([packet[0], packet[1]]);
    let flags = u16::from_be_bytes([packet[2], packet[3]]);
    let questions = u16::from_be_bytes([packet[4], packet[5]]);
    // A query (QR = 0), standard opcode, exactly one question.
    if flags & 0x8000 != 0 || (flags >> 11) & 0xf != 0 || questions != 1 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let length = usize::from(*packet.get(at)?);
        at += 1;
        if length == 0 {
            break;
        }
        // No compression pointers in a question; labels up to 63 bytes.
        if length > 63 {
            return None;
        }
        let label = packet.get(at..at + length)?;
        labels.push(std::str::from_utf8(label).ok()?.to_ascii_lowercase());
        at += length;
    }
    let name = labels.join(".");
    if name.is_empty() || name.len() > 253 {
        return None;
    }
    let qtype = u16::from_be_bytes([*packet.get(at)?, *packet.get(at + 1)?]);
    let qclass = u16::from_be_bytes([*packet.get(at + 2)?, *packet.get(at + 3)?]);
    Some(Query {
        id,
        flags,
        name,
        qtype,
        qclass,
        question_end: at + 4,
    })
}

/// The answer to `query` (read from `packet`) with `rcode` and, for NOERROR, `addresses` of
/// the asked type.
pub fn answer(packet: &[u8], query: &Query, rcode: u8, addresses: &[IpAddr]) -> Vec<u8> {
    let records: Vec<&IpAddr> = addresses
        .iter()
        .filter(|address| match address {
            IpAddr::V4(_) => query.qtype == TYPE_A,
            IpAddr::V6(_) => query.qtype == TYPE_AAAA,
        })
        .collect();
    let mut out = Vec::with_capacity(query.question_end + records.len() * 28);
    out.extend_from_slice(&query.id.to_be_bytes());
    // QR, the query's opcode and RD, RA; the rcode.
    let flags = 0x8000 | (query.flags & 0x0100) | 0x0080 | u16::from(rcode);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    let count = if rcode == NOERROR { records.len() } else { 0 };
    out.extend_from_slice(&(count as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&packet[12..query.question_end]);
    for address in records.into_iter().take(count) {
        out.extend_from_slice(&[0xc0, 0x0c]); // the question's name
        let (kind, data): (u16, Vec<u8>) = match address {
            IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
            IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
        };
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&TTL.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(&data);
    }
    out
}

/// A malformed query's answer: FORMERR when there is a header to answer.
fn format_error(packet: &[u8]) -> Option<Vec<u8>> {
    if packet.len() < 12 {
        return None;
    }
    let mut out = packet[..12].to_vec();
    out[2] = 0x80 | (packet[2] & 0x01);
    out[3] = 0x80 | FORMERR;
    out[4..12].fill(0);
    Some(out)
}

pub struct Responder {
    pub registry: Arc<Registry>,
    pub resolver: Resolver,
    pub node_addresses: Vec<IpAddr>,
    pub denied_networks: Vec<ssrf::Cidr>,
    pub flows: mpsc::Sender<Flow>,
}

impl Responder {
    /// Answers sandboxes' queries on `socket` until the task is dropped.
    pub async fn serve(self: Arc<Self>, socket: UdpSocket) {
        let socket = Arc::new(socket);
        let outstanding = Arc::new(tokio::sync::Semaphore::new(MAX_OUTSTANDING));
        let mut packet = [0u8; 1500];
        loop {
            let Ok((length, peer)) = socket.recv_from(&mut packet).await else {
                continue;
            };
            // Strangers get nothing; a sandbox past its rate, or a node with every slot
            // taken, gets no answer (its resolver retries), and costs no task.
            let Some(entry) = self.registry.get(peer.ip()) else {
                continue;
            };
            if !entry.queries.take() {
                continue;
            }
            let Ok(slot) = Arc::clone(&outstanding).try_acquire_owned() else {
                continue;
            };
            let query = packet[..length].to_vec();
            let (responder, socket) = (Arc::clone(&self), Arc::clone(&socket));
            tokio::spawn(async move {
                let _slot = slot;
                let reply = responder.reply(&query, peer).await;
                let answered = reply.as_ref().map_or(0, Vec::len);
                entry
                    .metered
                    .fetch_add((query.len() + answered) as u64, Ordering::Relaxed);
                if let Some(reply) = reply {
                    let _ = socket.send_to(&reply, peer).await;
                }
            });
        }
    }

    /// The reply to one datagram (none for strangers).
    pub async fn reply(&self, packet: &[u8], peer: SocketAddr) -> Option<Vec<u8>> {
        let entry = self.registry.get(peer.ip())?;
        let Some(query) = parse_query(packet) else {
            return format_error(packet);
        };
        let started = Instant::now();
        let record = |decision: Decision| Flow {
            sandbox: entry.sandbox.clone(),
            host: query.name.clone(),
            port: 53,
            mode: "dns".to_owned(),
            decision,
            intercepted: false,
            credentials: Vec::new(),
            leak: None,
            address: None,
            bytes_up: packet.len() as u64,
            bytes_down: 0,
            duration: started.elapsed(),
            started_at: std::time::SystemTime::now(),
        };
        // The store host, for a sandbox with store access: an address whose port 80 is
        // redirected to the proxy like any other.
        if query.qclass == CLASS_IN && query.name == crate::STORE_HOST && entry.store.is_some() {
            let store = [IpAddr::V4(crate::STORE_ADDRESS)];
            return Some(answer(packet, &query, NOERROR, &store));
        }
        if query.qclass != CLASS_IN || !entry.policy().allows_name(&query.name) {
            let _ = self.flows.try_send(record(Decision::Denied(format!(
                "{} is not allowed by this sandbox's egress policy; NXDOMAIN",
                query.name
            ))));
            return Some(answer(packet, &query, NXDOMAIN, &[]));
        }
        let resolved = tokio::time::timeout(
            Duration::from_secs(5),
            self.resolver.resolve(&query.name, 0),
        )
        .await;
        let addresses = match resolved {
            Ok(Ok(addresses)) => addresses,
            _ => return Some(answer(packet, &query, SERVFAIL, &[])),
        };
        // The same guard as the proxy: a name that leads inside is not answered at all.
        if let Some((address, blocked)) = addresses.iter().find_map(|address| {
            ssrf::check(*address, &self.node_addresses, &self.denied_networks)
                .err()
                .map(|blocked| (address, blocked))
        }) {
            let _ = self.flows.try_send(record(Decision::Denied(format!(
                "{} resolves to {address} ({}); refused",
                query.name,
                blocked.as_str()
            ))));
            return Some(answer(packet, &query, REFUSED, &[]));
        }
        Some(answer(packet, &query, NOERROR, &addresses))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut packet = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            packet.push(label.len() as u8);
            packet.extend_from_slice(label.as_bytes());
        }
        packet.push(0);
        packet.extend_from_slice(&qtype.to_be_bytes());
        packet.extend_from_slice(&CLASS_IN.to_be_bytes());
        packet
    }

    #[test]
    fn queries_are_read_and_answered_in_the_wire_format() {
        let packet = query("API.Example.com", TYPE_A);
        let parsed = parse_query(&packet).unwrap();
        assert_eq!(
            (parsed.id, parsed.name.as_str(), parsed.qtype),
            (0x1234, "api.example.com", TYPE_A)
        );
        let addresses = [
            "203.0.113.7".parse().unwrap(),
            "2001:db8::7".parse().unwrap(),
        ];
        let reply = answer(&packet, &parsed, NOERROR, &addresses);
        // id, QR|RD|RA, one question, one answer (the A record only).
        assert_eq!(&reply[..8], &[0x12, 0x34, 0x81, 0x80, 0, 1, 0, 1]);
        assert_eq!(&reply[reply.len() - 4..], &[203, 0, 113, 7]);
        let refused = answer(&packet, &parsed, NXDOMAIN, &addresses);
        assert_eq!((refused[3] & 0x0f, refused[7]), (NXDOMAIN, 0));
        assert_eq!(refused.len(), packet.len());
        for bad in [
            &packet[..11],
            &packet[..packet.len() - 1],
            &[
                0x12, 0x34, 0x81, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1,
            ][..],
        ] {
            assert!(parse_query(bad).is_none());
        }
        assert_eq!(format_error(&packet).unwrap()[3], 0x80 | FORMERR);
    }
}
