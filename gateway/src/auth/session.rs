//! Dashboard session tokens: compact JWS (JWT) signed with HMAC-SHA256.
//!
//! Only HS256 is produced or accepted; the header is compared byte for byte, so
//! `alg: none` and algorithm-confusion tokens are rejected before any claim is read.
//! A general JWT library would bring RSA and elliptic-curve code this gateway never
//! uses, which matters for build time on small machines.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

use crate::error::ApiError;

const ISSUER: &str = "sandbase";
/// `{"alg":"HS256","typ":"JWT"}`: the only header this gateway issues or accepts.
const HEADER_JSON: &str = r#"{"alg":"HS256","typ":"JWT"}"#;
/// Clock skew tolerated between gateways when checking `exp` and `iat`.
const LEEWAY_SECS: i64 = 5;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    /// The user.
    pub sub: Uuid,
    /// The team the session acts for.
    pub team: Uuid,
    pub iat: i64,
    pub exp: i64,
    pub jti: Uuid,
}

/// Signs and verifies session tokens with one secret.
pub struct SessionKeys {
    secret: SecretString,
    ttl_secs: i64,
}

impl SessionKeys {
    pub fn new(secret: SecretString, ttl_secs: u64) -> Self {
        SessionKeys {
            secret,
            ttl_secs: i64::try_from(ttl_secs).unwrap_or(i64::MAX),
        }
    }

    /// Issues a token for `user` acting in `team`.
    pub fn issue(&self, user: Uuid, team: Uuid) -> (String, DateTime<Utc>) {
        let now = Utc::now();
        let expires_at = now + chrono::Duration::seconds(self.ttl_secs);
        let claims = Claims {
            iss: ISSUER.to_owned(),
            sub: user,
            team,
            iat: now.timestamp(),
            exp: expires_at.timestamp(),
            jti: Uuid::new_v4(),
        };
        // Serializing a struct of strings, ids and integers cannot fail.
        let claims_json = serde_json::to_vec(&claims).unwrap_or_default();
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(HEADER_JSON),
            URL_SAFE_NO_PAD.encode(claims_json)
        );
        let signature =
            URL_SAFE_NO_PAD.encode(self.mac(signing_input.as_bytes()).finalize().into_bytes());
        (format!("{signing_input}.{signature}"), expires_at)
    }

    /// Verifies signature, header, issuer and expiry, in that order.
    pub fn verify(&self, token: &str, now: DateTime<Utc>) -> Result<Claims, ApiError> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ApiError::InvalidSession);
        };
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| ApiError::InvalidSession)?;
        let signing_input_length = header.len() + 1 + payload.len();
        let mac = self.mac(&token.as_bytes()[..signing_input_length]);
        mac.verify_slice(&signature)
            .map_err(|_| ApiError::InvalidSession)?;
        let header = URL_SAFE_NO_PAD
            .decode(header)
            .map_err(|_| ApiError::InvalidSession)?;
        if header != HEADER_JSON.as_bytes() {
            return Err(ApiError::InvalidSession);
        }
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| ApiError::InvalidSession)?;
        let claims: Claims =
            serde_json::from_slice(&payload).map_err(|_| ApiError::InvalidSession)?;
        if claims.iss != ISSUER || claims.iat > now.timestamp() + LEEWAY_SECS {
            return Err(ApiError::InvalidSession);
        }
        if claims.exp + LEEWAY_SECS <= now.timestamp() {
            return Err(ApiError::SessionExpired);
        }
        Ok(claims)
    }

    fn mac(&self, data: &[u8]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.secret.expose_secret().as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(data);
        mac
    }
}

/// Whether a bearer token has the shape of a JWT (three dot-separated parts).
pub fn looks_like_jwt(token: &str) -> bool {
    token.bytes().filter(|byte| *byte == b'.').count() == 2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> SessionKeys {
        SessionKeys::new(SecretString::from("0123456789abcdef0123456789abcdef"), 60)
    }

    #[test]
    fn issued_tokens_verify() {
        let keys = keys();
        let (user, team) = (Uuid::new_v4(), Uuid::new_v4());
        let (token, _) = keys.issue(user, team);
        let claims = keys.verify(&token, Utc::now()).expect("valid token");
        assert_eq!((claims.sub, claims.team), (user, team));
    }

    #[test]
    fn expired_and_foreign_tokens_are_rejected() {
        let keys = keys();
        let (token, _) = keys.issue(Uuid::new_v4(), Uuid::new_v4());
        let later = Utc::now() + chrono::Duration::seconds(120);
        assert!(matches!(
            keys.verify(&token, later),
            Err(ApiError::SessionExpired)
        ));
        let other = SessionKeys::new(SecretString::from("another-secret-another-secret-xx"), 60);
        assert!(matches!(
            other.verify(&token, Utc::now()),
            Err(ApiError::InvalidSession)
        ));
    }

    #[test]
    fn alg_none_is_rejected() {
        let keys = keys();
        let (token, _) = keys.issue(Uuid::new_v4(), Uuid::new_v4());
        let payload = token.split('.').nth(1).expect("payload");
        let forged = format!(
            "{}.{payload}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#)
        );
        assert!(matches!(
            keys.verify(&forged, Utc::now()),
            Err(ApiError::InvalidSession)
        ));
    }
}
