//! TLS for interception: a certificate authority per sandbox (ECDSA P-256, generated when the
//! sandbox is created, its key in this process's memory only) whose certificate the sandbox
//! trusts, leaf certificates it signs per host name (each with its own key, cached), and the
//! client configuration that verifies upstream servers against the system's roots (plus an
//! extra CA for tests).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Leaf certificates kept per sandbox (the oldest are dropped past this).
const LEAVES_KEPT: usize = 256;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl Authority {
    pub fn generate(sandbox: &str) -> Result<Authority, rcgen::Error> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, "SandBase");
        name.push(
            DnType::CommonName,
            format!("SandBase egress CA for sandbox {sandbox}"),
        );
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let (not_before, not_after) = validity(400);
        params.not_before = not_before;
        params.not_after = not_after;
        Ok(Authority {
            issuer: CertifiedIssuer::self_signed(params, key)?,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM, for the sandbox's trust store.
    pub fn certificate_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A TLS server configuration presenting a certificate for `host` (made once, then
    /// cached).
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, String> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = leaves.get(host) {
            return Ok(Arc::clone(config));
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|error| error.to_string())?;
        let mut params =
            CertificateParams::new(vec![host.to_owned()]).map_err(|error| error.to_string())?;
        params
            .distinguished_name
            .push(DnType::CommonName, host.to_owned());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let (not_before, not_after) = validity(30);
        params.not_before = not_before;
        params.not_after = not_after;
        let leaf = params
            .signed_by(&key, &self.issuer)
            .map_err(|error| error.to_string())?;
        let chain = vec![leaf.der().clone(), self.issuer.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| error.to_string())?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|error| error.to_string())?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= LEAVES_KEPT {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), Arc::clone(&config));
        Ok(config)
    }
}

/// From a day ago to `days` from now.
fn validity(days: i64) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    (
        now - time::Duration::days(1),
        now + time::Duration::days(days),
    )
}

/// The client side of interception: the system's roots, plus `extra_ca_pem` (certificates
/// in PEM) when given.
pub fn upstream_config(extra_ca_pem: Option<&[u8]>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for certificate in native.certs {
        let _ = roots.add(certificate);
    }
    if let Some(pem) = extra_ca_pem {
        for certificate in CertificateDer::pem_slice_iter(pem) {
            let certificate =
                certificate.map_err(|error| format!("the extra CA is not PEM: {error}"))?;
            roots
                .add(certificate)
                .map_err(|error| format!("the extra CA: {error}"))?;
        }
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
