//! TLS for SandBase's own internal channel, gateway ↔ workers: the operator's CA, and each
//! end's certificate and key (PEM files). Both ends serve with their certificate and trust
//! only the CA when they call the other — not the system's roots, so no public certificate
//! can stand in for a node. `generate` makes a CA and one certificate for local use
//! (`sandbase dev`, tests).

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

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
}

impl ChannelFiles {
    pub fn load(&self) -> Result<ChannelTls, String> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|error| format!("reading {}: {error}", path.display()))
        };
        from_pem(
            &read(&self.ca_file)?,
            &read(&self.cert_file)?,
            &read(&self.key_file)?,
        )
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
}
