//! Sandbox egress: what a sandbox may reach and how its traffic leaves.
//!
//! `policy`: host patterns and deny-by-default policies (shared with secrets, which name the
//! hosts a credential is for). `ssrf`: the guard every resolved address passes. `proxy`: the
//! explicit proxy listener (CONNECT and plain HTTP) with policy checks, resolution by the
//! proxy itself, dialing exactly the checked address, explained refusals and a flow log;
//! its transparent listeners (`sni`: the server name of a ClientHello). `credentials`,
//! `tls`: interception — injection and placeholders, the per-sandbox CA and upstream trust;
//! `scrub`: the values' forms taken out of what comes back.
//! `limits`: per-sandbox buckets (DNS, new connections) and the process's connection budget.
//! `stream`: replayed and counted sandbox connections. `relay`: tunnels moved with splice(2),
//! closed when idle. `dns`: the node's DNS responder
//! (answers only names a sandbox's policy allows). `proxy/store.rs`: the store host, forwarded
//! to the gateway with the sandbox's store credential.
//! `process`: the proxy as a process of its own, ordered about by its worker over a pipe.
//! `channel`: TLS for SandBase's internal channel (gateway ↔ workers), which the gateway and
//! the workers share with this crate's TLS code.

pub mod body_scan;
pub mod channel;
pub mod credentials;
pub mod dns;
pub mod limits;
pub mod policy;
pub mod process;
pub mod proxy;
pub mod relay;
pub mod scrub;
pub mod sni;
pub mod ssrf;
pub mod stream;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;

pub use policy::{HostPattern, Policy, parse_patterns};

/// The name under which a sandbox created with store access reaches SandBase's model and API
/// store: plain HTTP to its node's proxy, which forwards each request to the gateway with the
/// sandbox's own store credential (the sandbox never holds it). `.internal` is reserved for
/// private use, so the name can never be a real host.
pub const STORE_HOST: &str = "store.sandbase.internal";

/// What the DNS responder answers for [`STORE_HOST`] (TEST-NET-1, never routed): a client
/// that ignores the proxy variables connects there on port 80 and is redirected to the proxy
/// like any other.
pub const STORE_ADDRESS: std::net::Ipv4Addr = std::net::Ipv4Addr::new(192, 0, 2, 80);
