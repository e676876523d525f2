//! TLS for SandBase's own internal channel, gateway ↔ workers: the operator's CA, and each
//! end's certificate and key (PEM files). Both ends serve with their certificate and trust
//! only the CA when they call the other — not the system's roots, so no public certificate
//! can stand in for a node. A gateway may call its workers as one name whatever their
//! addresses (`peer_name`: workers holding one certificate of that name, not the gateway's).
//! `generate` makes a CA and one certificate for local use (`sandbase dev`, tests).

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// One end's TLS: how it serves and how it calls the other end.
#[derive(Clone)]
pub struct ChannelTls {
    pub server: Arc<ServerConfig>,
    pub client: Arc<ClientConfig>,
    /// The CA (PEM), for a process of this end's that calls the other (the egress proxy's
    /// store route).
    pub ca_pem: String,
}

impl std::fmt::Debug for ChannelTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ChannelTls")
    }
}

/// Where an end's PEM files are.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelFiles {
    /// The CA that signed every end's certificate.
    pub ca_file: std::path::PathBuf,
    /// This end's certificate (chain), then its key.
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
    /// The name every peer this end calls must prove, whatever address it is reached at:
    /// the gateway's, when the workers share a certificate of one name that no node address
    /// is in (the Helm chart's generated channel). None: each address's own host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_name: Option<String>,
}

impl ChannelFiles {
    pub fn load(&self) -> Result<ChannelTls, String> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|error| format!("reading {}: {error}", path.display()))
        };
        let tls = from_pem(
            &read(&self.ca_file)?,
            &read(&self.cert_file)?,
            &read(&self.key_file)?,
        )?;
        match &self.peer_name {
            Some(name) => tls.calling_peers_as(name),
            None => Ok(tls),
        }
    }
}

impl ChannelTls {
    /// This end, calling its peers as `name` whatever address they are reached at: a peer
    /// must hold a certificate of the CA naming `name`.
    pub fn calling_peers_as(mut self, name: &str) -> Result<ChannelTls, String> {
        let name = ServerName::try_from(name.to_owned())
            .map_err(|_| format!("peer_name: {name:?} is not a host name or an address"))?;
        let roots = roots(self.ca_pem.as_bytes())?;
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|error| error.to_string())?;
        let client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| error.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AsNamed { inner, name }))
            .with_no_client_auth();
        self.client = Arc::new(client);
        Ok(self)
    }
}

/// The CA's verification of a peer's certificate, for one fixed name.
#[derive(Debug)]
struct AsNamed {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for AsNamed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _address: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner
            .verify_tls12_signature(message, certificate, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner
            .verify_tls13_signature(message, certificate, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The CA certificate(s) in `ca` (PEM) as the only roots.
fn roots(ca: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca) {
        let certificate = certificate.map_err(|error| format!("the CA file: {error}"))?;
        roots
            .add(certificate)
            .map_err(|error| format!("the CA file: {error}"))?;
    }
    if roots.is_empty() {
        return Err("the CA file holds no certificate".to_owned());
    }
    Ok(roots)
}

/// A client of the channel that trusts only the CA in `ca` (PEM): the operator's tools.
pub fn client_trusting(ca: &[u8]) -> Result<ClientConfig, String> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots(ca)?)
        .with_no_client_auth())
}

/// Builds an end from PEM text: the CA certificate(s), this end's chain and its key.
pub fn from_pem(ca: &[u8], chain: &[u8], key: &[u8]) -> Result<ChannelTls, String> {
    let client = client_trusting(ca)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain)
        .collect::<Result<_, _>>()
        .map_err(|error| format!("the certificate file: {error}"))?;
    if chain.is_empty() {
        return Err("the certificate file holds no certificate".to_owned());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key).map_err(|error| format!("the key file: {error}"))?;
    let server = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| format!("the certificate and key: {error}"))?;
    Ok(ChannelTls {
        server: Arc::new(server),
        client: Arc::new(client),
        ca_pem: String::from_utf8_lossy(ca).into_owned(),
    })
}

/// A CA and one certificate it signed for `names` (host names or IP addresses), as PEM:
/// (CA certificate, certificate, key). For a single machine: `sandbase dev` and tests.
pub fn generate(names: &[&str]) -> Result<(String, String, String), String> {
    let error = |error: rcgen::Error| error.to_string();
    let ca_key = KeyPair::generate().map_err(error)?;
    let mut ca = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "SandBase internal CA");
    ca.distinguished_name = name;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let (not_before, not_after) = validity(3650);
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_certificate = ca.self_signed(&ca_key).map_err(error)?;
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().map_err(error)?;
    let mut leaf = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "SandBase internal channel");
    leaf.distinguished_name = name;
    leaf.subject_alt_names = names
        .iter()
        .map(|name| match name.parse::<std::net::IpAddr>() {
            Ok(address) => Ok(SanType::IpAddress(address)),
            Err(_) => Ok(SanType::DnsName((*name).try_into().map_err(error)?)),
        })
        .collect::<Result<_, String>>()?;
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let leaf_certificate = leaf.signed_by(&leaf_key, &issuer).map_err(error)?;
    Ok((
        ca_certificate.pem(),
        leaf_certificate.pem(),
        leaf_key.serialize_pem(),
    ))
}

/// From a day ago to `days` from now.
fn validity(days: i64) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    (
        now - time::Duration::days(1),
        now + time::Duration::days(days),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_channel_loads_and_garbage_is_refused() {
        let (ca, certificate, key) = generate(&["127.0.0.1", "localhost"]).unwrap();
        assert!(from_pem(ca.as_bytes(), certificate.as_bytes(), key.as_bytes()).is_ok());
        assert!(from_pem(b"", certificate.as_bytes(), key.as_bytes()).is_err());
        assert!(from_pem(ca.as_bytes(), b"", key.as_bytes()).is_err());
        assert!(from_pem(ca.as_bytes(), certificate.as_bytes(), b"nonsense").is_err());
        let (_, other_certificate, _) = generate(&["127.0.0.1"]).unwrap();
        // A certificate with another's key.
        assert!(from_pem(ca.as_bytes(), other_certificate.as_bytes(), key.as_bytes()).is_err());
    }

    /// Serves `server` once on loopback and answers whether `client` completed a handshake
    /// with it, reaching it by its address.
    async fn handshake(server: &ChannelTls, client: &ChannelTls) -> bool {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server.server.clone());
        let serving = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let _ = acceptor.accept(stream).await;
        });
        let stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let connector = tokio_rustls::TlsConnector::from(client.client.clone());
        let name = ServerName::IpAddress(address.ip().into());
        let done = connector.connect(name, stream).await.is_ok();
        serving.abort();
        done
    }

    #[tokio::test]
    async fn a_peer_name_is_what_a_peer_must_prove_whatever_its_address() {
        let (ca, worker_certificate, worker_key) = generate(&["worker.sandbase.internal"]).unwrap();
        let worker = from_pem(
            ca.as_bytes(),
            worker_certificate.as_bytes(),
            worker_key.as_bytes(),
        )
        .unwrap();
        let gateway = || {
            from_pem(
                ca.as_bytes(),
                worker_certificate.as_bytes(),
                worker_key.as_bytes(),
            )
            .unwrap()
        };
        // By its address alone the worker's certificate does not hold.
        assert!(!handshake(&worker, &gateway()).await);
        let calling = gateway()
            .calling_peers_as("worker.sandbase.internal")
            .unwrap();
        assert!(handshake(&worker, &calling).await);
        // Another name, or another CA's certificate of the right name, does not hold.
        let elsewhere = gateway()
            .calling_peers_as("gateway.sandbase.internal")
            .unwrap();
        assert!(!handshake(&worker, &elsewhere).await);
        let (other_ca, other_certificate, other_key) =
            generate(&["worker.sandbase.internal"]).unwrap();
        let impostor = from_pem(
            other_ca.as_bytes(),
            other_certificate.as_bytes(),
            other_key.as_bytes(),
        )
        .unwrap();
        assert!(!handshake(&impostor, &calling).await);
        assert!(gateway().calling_peers_as("not a name").is_err());
    }
}
