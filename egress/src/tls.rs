//! TLS for interception: a certificate authority per sandbox (ECDSA P-256, generated when the
//! sandbox is created, its key in this process's memory only) whose certificate the sandbox
//! trusts, leaf certificates it signs per host name (each with its own key, cached), and the
//! client configuration that verifies upstream servers against the system's roots (plus an
//! extra CA for tests).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use zeroize::Zeroizing;

/// Leaf certificates kept per sandbox (the oldest are dropped past this).
const LEAVES_KEPT: usize = 256;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    certificate: CertificateDer<'static>,
    certificate_pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

/// A sandbox CA as the worker keeps it, to hand to its proxy process again when that
/// restarts: the certificate the sandbox trusts and its key (zeroed when dropped).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct CaKeys {
    pub certificate_pem: String,
    pub key_pem: Zeroizing<String>,
}

impl std::fmt::Debug for CaKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaKeys").finish_non_exhaustive()
    }
}

/// The CA's name and constraints, the same when it is made and when it is restored (a
/// restored issuer signs leaves that chain to the certificate made first).
fn ca_params(sandbox: &str) -> CertificateParams {
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
    params
}

impl Authority {
    /// A new CA for the sandbox: its certificate and key.
    pub fn generate_keys(sandbox: &str) -> Result<CaKeys, rcgen::Error> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = ca_params(sandbox);
        let (not_before, not_after) = validity(400);
        params.not_before = not_before;
        params.not_after = not_after;
        let certificate = params.self_signed(&key)?;
        Ok(CaKeys {
            certificate_pem: certificate.pem(),
            key_pem: Zeroizing::new(key.serialize_pem()),
        })
    }

    /// The CA made by [`Authority::generate_keys`], ready to sign leaves.
    pub fn from_keys(sandbox: &str, keys: &CaKeys) -> Result<Authority, String> {
        let key = KeyPair::from_pem(&keys.key_pem).map_err(|error| error.to_string())?;
        let certificate = CertificateDer::from_pem_slice(keys.certificate_pem.as_bytes())
            .map_err(|error| format!("the CA certificate: {error}"))?;
        Ok(Authority {
            issuer: Issuer::new(ca_params(sandbox), key),
            certificate,
            certificate_pem: keys.certificate_pem.clone(),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    pub fn generate(sandbox: &str) -> Result<Authority, String> {
        let keys = Self::generate_keys(sandbox).map_err(|error| error.to_string())?;
        Self::from_keys(sandbox, &keys)
    }

    /// The CA certificate, PEM, for the sandbox's trust store.
    pub fn certificate_pem(&self) -> String {
        self.certificate_pem.clone()
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
        let chain = vec![leaf.der().clone(), self.certificate.clone()];
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
