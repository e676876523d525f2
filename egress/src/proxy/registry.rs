//! The sandboxes the proxy serves, by source address, and how it resolves names.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, RwLock};

use tokio::sync::Semaphore;

use crate::limits::{Bucket, CONNECTIONS_BURST, CONNECTIONS_PER_SECOND, DNS_BURST, DNS_PER_SECOND};

use crate::credentials::Credential;
use crate::policy::Policy;
use crate::tls::Authority;

/// A sandbox as the proxy knows it: who it is and what it may reach (changed at run time
/// with [`Registry::set_policy`]; effective for new connections).
pub struct Entry {
    pub sandbox: String,
    policy: RwLock<Arc<Policy>>,
    pub(super) connections: Semaphore,
    pub(super) interception: Option<Arc<Interception>>,
    /// New connections, and DNS queries, a second.
    pub(super) opens: Bucket,
    pub(crate) queries: Bucket,
    /// Bytes it moved through the proxy (both ways, DNS included), counted as they move:
    /// reported to the worker as a running total, metered from it.
    pub metered: Arc<AtomicU64>,
    /// Its store credential, when it may reach the store host.
    pub(crate) store: Option<Arc<zeroize::Zeroizing<String>>>,
}

/// A sandbox's credentials and the CA its intercepted connections are signed by; both live
/// only here, in memory (values zeroed when the sandbox is removed).
pub struct Interception {
    pub credentials: Vec<Credential>,
    pub authority: Authority,
}

impl Interception {
    /// Whether TLS to `host:port` is opened: a credential is bound to it, or the sandbox holds
    /// placeholders that must not leave for other HTTPS hosts.
    pub(super) fn wants(&self, host: &str, port: u16) -> bool {
        self.credentials
            .iter()
            .any(|credential| credential.binds(host, port))
            || (port == 443
                && self
                    .credentials
                    .iter()
                    .any(|credential| credential.placeholder().is_some()))
    }

    /// The credential whose placeholder is in `bytes` (plain HTTP: no host may get one).
    pub(super) fn placeholder_in(&self, bytes: &[u8]) -> Option<&str> {
        self.credentials
            .iter()
            .find(|credential| {
                credential.placeholder().is_some_and(|placeholder| {
                    bytes
                        .windows(placeholder.len())
                        .any(|window| window == placeholder.as_bytes())
                })
            })
            .map(|credential| credential.name.as_str())
    }
}

/// Sandboxes by source address.
#[derive(Default)]
pub struct Registry {
    entries: RwLock<HashMap<IpAddr, Arc<Entry>>>,
    /// New connections a second and their burst for sandboxes added from now on (`None`:
    /// [`CONNECTIONS_PER_SECOND`], [`CONNECTIONS_BURST`]).
    connection_rate: RwLock<Option<(f64, f64)>>,
}

impl Registry {
    pub fn add(
        &self,
        address: IpAddr,
        sandbox: &str,
        policy: Policy,
        max_connections: usize,
        interception: Option<Arc<Interception>>,
        store: Option<Arc<zeroize::Zeroizing<String>>>,
    ) {
        let (rate, burst) = self
            .connection_rate
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .unwrap_or((CONNECTIONS_PER_SECOND, CONNECTIONS_BURST));
        let entry = Arc::new(Entry {
            sandbox: sandbox.to_owned(),
            policy: RwLock::new(Arc::new(policy)),
            connections: Semaphore::new(max_connections),
            interception,
            opens: Bucket::new(rate, burst),
            queries: Bucket::new(DNS_PER_SECOND, DNS_BURST),
            metered: Arc::default(),
            store,
        });
        self.write().insert(address, entry);
    }

    /// Sets the connection rate of sandboxes added from now on (benchmarks measuring
    /// latency over many connections from one source).
    pub fn set_connection_rate(&self, per_second: f64, burst: f64) {
        *self
            .connection_rate
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((per_second, burst));
    }

    /// Removes a sandbox; returns what it was (for its last byte count).
    pub fn remove(&self, address: IpAddr) -> Option<Arc<Entry>> {
        self.write().remove(&address)
    }

    /// Every sandbox registered.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        self.entries
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Replaces a sandbox's policy; `false` when the address is not registered.
    pub fn set_policy(&self, address: IpAddr, policy: Policy) -> bool {
        let Some(entry) = self.get(address) else {
            return false;
        };
        *entry
            .policy
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(policy);
        true
    }

    pub fn get(&self, address: IpAddr) -> Option<Arc<Entry>> {
        self.entries
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&address)
            .cloned()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<IpAddr, Arc<Entry>>> {
        self.entries
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Entry {
    pub(crate) fn policy(&self) -> Arc<Policy> {
        Arc::clone(
            &self
                .policy
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }
}

/// How names are resolved: the system's resolver; names the operator pinned, then the
/// system's (`sandbase worker --egress-resolve`: split-horizon names, upstreams of a test);
/// or only an explicit table (tests). Whatever the way, every address then passes the same
/// SSRF guard: a pinned name is not an allowed one.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolver {
    System,
    Pinned(HashMap<String, Vec<IpAddr>>),
    Fixed(HashMap<String, Vec<IpAddr>>),
}

impl Resolver {
    pub(crate) async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
        let _ = port;
        match self {
            Resolver::Pinned(table) => match table.get(&host.to_ascii_lowercase()) {
                Some(addresses) => Ok(addresses.clone()),
                None => Self::resolve_system(host).await,
            },
            Resolver::System => Self::resolve_system(host).await,
            Resolver::Fixed(table) => table
                .get(host)
                .cloned()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such name")),
        }
    }

    /// The system's resolver, a bounded number of lookups at once.
    async fn resolve_system(host: &str) -> std::io::Result<Vec<IpAddr>> {
        // At most this many lookups wait on upstream servers at once; the rest wait for a
        // turn (the DNS responder drops what it cannot queue).
        let _turn = LOOKUPS.acquire().await.map_err(std::io::Error::other)?;
        let resolver = system_resolver()?;
        let found = resolver
            .lookup_ip(host)
            .await
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::NotFound, error))?;
        Ok(found.iter().collect())
    }
}

/// Lookups in flight at once.
const MAX_LOOKUPS: usize = 128;
static LOOKUPS: Semaphore = Semaphore::const_new(MAX_LOOKUPS);

/// The node's resolver (its `/etc/resolv.conf`), asynchronous and caching, made once.
fn system_resolver() -> std::io::Result<&'static hickory_resolver::TokioResolver> {
    static RESOLVER: OnceLock<Result<hickory_resolver::TokioResolver, String>> = OnceLock::new();
    RESOLVER
        .get_or_init(|| {
            hickory_resolver::TokioResolver::builder_tokio()
                .map_err(|error| error.to_string())?
                .build()
                .map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(|why| std::io::Error::other(why.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pinned_names_resolve_to_their_addresses_whatever_their_case() {
        let address: IpAddr = "203.0.113.7".parse().unwrap();
        let resolver = Resolver::Pinned(HashMap::from([(
            "api.internal.example".to_owned(),
            vec![address],
        )]));
        for name in ["api.internal.example", "API.Internal.Example"] {
            assert_eq!(resolver.resolve(name, 443).await.unwrap(), vec![address]);
        }
        // The table travels to the proxy process as JSON, unchanged.
        let sent = serde_json::to_string(&resolver).unwrap();
        let Resolver::Pinned(table) = serde_json::from_str(&sent).unwrap() else {
            panic!("not pinned after the trip: {sent}");
        };
        assert_eq!(table["api.internal.example"], vec![address]);
    }
}
