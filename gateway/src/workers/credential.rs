//! Per-worker credentials: `swc_<worker id>.<tag>`, the tag an HMAC-SHA256 of the worker id
//! under the deployment's node secret (`workers.node_token`). The gateway derives any
//! worker's credential and checks a presented one without storing anything; a worker holds
//! only its own, which names it: it cannot register, heartbeat or report usage as another
//! worker, it is not accepted by another worker, and it opens no operator route.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sandbase_api::internal::{WORKER_CREDENTIAL_PREFIX, credential_worker_id};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Separates these tags from any other use of the secret.
const CONTEXT: &[u8] = b"sandbase worker credential v1\0";

fn tag(secret: &SecretString, worker_id: &str) -> [u8; 32] {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.expose_secret().as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(CONTEXT);
    mac.update(worker_id.as_bytes());
    mac.finalize().into_bytes().into()
}

/// The credential of the worker `worker_id`.
pub fn derive(secret: &SecretString, worker_id: &str) -> String {
    format!(
        "{WORKER_CREDENTIAL_PREFIX}{worker_id}.{}",
        URL_SAFE_NO_PAD.encode(tag(secret, worker_id))
    )
}

/// The worker a presented credential names, when it is genuine.
pub fn verify<'a>(secret: &SecretString, presented: &'a str) -> Option<&'a str> {
    let worker_id = credential_worker_id(presented)?;
    let (_, presented_tag) = presented.rsplit_once('.')?;
    let presented_tag = URL_SAFE_NO_PAD.decode(presented_tag).ok()?;
    bool::from(presented_tag.ct_eq(&tag(secret, worker_id))).then_some(worker_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_names_its_worker_and_nothing_else_verifies() {
        let secret = SecretString::from("node secret of the deployment");
        let credential = derive(&secret, "node-7");
        assert_eq!(verify(&secret, &credential), Some("node-7"));
        // Another worker's name with this tag, another secret, the secret itself, garbage.
        let (_, tag) = credential.rsplit_once('.').unwrap();
        assert_eq!(verify(&secret, &format!("swc_node-8.{tag}")), None);
        let other = SecretString::from("another deployment's secret");
        assert_eq!(verify(&other, &credential), None);
        assert_eq!(verify(&secret, "node secret of the deployment"), None);
        assert_eq!(verify(&secret, "swc_.abc"), None);
        assert_eq!(verify(&secret, "swc_node-7."), None);
        // Ids with dots survive the round trip.
        let dotted = derive(&secret, "rack1.node7");
        assert_eq!(verify(&secret, &dotted), Some("rack1.node7"));
    }
}
