//! Dashboard session tokens: JWTs signed with HMAC-SHA256, through the `jsonwebtoken` crate
//! (its RustCrypto backend, without PEM support).
//!
//! Only HS256 is produced or accepted: a token whose header names another algorithm —
//! `none`, or an asymmetric one for algorithm confusion — is refused before its signature or
//! claims are looked at. Issuer, subject, issue and expiry times are required; the times are
//! checked against the caller's clock (with a few seconds' leeway between gateways).

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::ApiError;

const ISSUER: &str = "sandbase";
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
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    ttl_secs: i64,
}

impl SessionKeys {
    pub fn new(secret: SecretString, ttl_secs: u64) -> anyhow::Result<Self> {
        let bytes = secret.expose_secret().as_bytes();
        let mut validation = Validation::new(Algorithm::HS256);
        validation.algorithms = vec![Algorithm::HS256];
        validation.set_issuer(&[ISSUER]);
        validation.set_required_spec_claims(&["iss", "sub", "iat", "exp"]);
        // Expiry is checked against the caller's clock in `verify`.
        validation.validate_exp = false;
        Ok(SessionKeys {
            encoding: EncodingKey::from_secret(bytes)
                .map_err(|error| anyhow::anyhow!("the session signing key: {error}"))?,
            decoding: DecodingKey::from_secret(bytes)
                .map_err(|error| anyhow::anyhow!("the session signing key: {error}"))?,
            validation,
            ttl_secs: i64::try_from(ttl_secs).unwrap_or(i64::MAX),
        })
    }

    /// Issues a token for `user` acting in `team`.
    pub fn issue(&self, user: Uuid, team: Uuid) -> Result<(String, DateTime<Utc>), ApiError> {
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
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|error| anyhow::anyhow!("signing a session token: {error}"))?;
        Ok((token, expires_at))
    }

    /// Verifies algorithm, signature, issuer and required claims, then issue and expiry
    /// times against `now`.
    pub fn verify(&self, token: &str, now: DateTime<Utc>) -> Result<Claims, ApiError> {
        let claims = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|_| ApiError::InvalidSession)?
            .claims;
        if claims.iat > now.timestamp() + LEEWAY_SECS {
            return Err(ApiError::InvalidSession);
        }
        if claims.exp + LEEWAY_SECS <= now.timestamp() {
            return Err(ApiError::SessionExpired);
        }
        Ok(claims)
    }
}

/// Whether a bearer token has the shape of a JWT (three dot-separated parts).
pub fn looks_like_jwt(token: &str) -> bool {
    token.bytes().filter(|byte| *byte == b'.').count() == 2
}

#[cfg(test)]
mod tests {
    use super::*;

    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    fn keys() -> SessionKeys {
        SessionKeys::new(SecretString::from("0123456789abcdef0123456789abcdef"), 60)
            .expect("session keys")
    }

    #[test]
    fn issued_tokens_verify() {
        let keys = keys();
        let (user, team) = (Uuid::new_v4(), Uuid::new_v4());
        let (token, _) = keys.issue(user, team).expect("a token");
        let claims = keys.verify(&token, Utc::now()).expect("valid token");
        assert_eq!((claims.sub, claims.team), (user, team));
    }

    #[test]
    fn expired_and_foreign_tokens_are_rejected() {
        let keys = keys();
        let (token, _) = keys.issue(Uuid::new_v4(), Uuid::new_v4()).expect("a token");
        let later = Utc::now() + chrono::Duration::seconds(120);
        assert!(matches!(
            keys.verify(&token, later),
            Err(ApiError::SessionExpired)
        ));
        let other = SessionKeys::new(SecretString::from("another-secret-another-secret-xx"), 60)
            .expect("session keys");
        assert!(matches!(
            other.verify(&token, Utc::now()),
            Err(ApiError::InvalidSession)
        ));
    }

    #[test]
    fn alg_none_is_rejected() {
        let keys = keys();
        let (token, _) = keys.issue(Uuid::new_v4(), Uuid::new_v4()).expect("a token");
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

    #[test]
    fn tampered_tokens_are_rejected() {
        let keys = keys();
        let (token, _) = keys.issue(Uuid::new_v4(), Uuid::new_v4()).expect("a token");
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        // Another team in the claims, the signature kept.
        let payload = URL_SAFE_NO_PAD.decode(&parts[1]).expect("base64");
        let mut claims: serde_json::Value = serde_json::from_slice(&payload).expect("json");
        claims["team"] = serde_json::json!(Uuid::new_v4());
        parts[1] = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).expect("json"));
        assert!(matches!(
            keys.verify(&parts.join("."), Utc::now()),
            Err(ApiError::InvalidSession)
        ));
        // An asymmetric algorithm named in the header (algorithm confusion).
        let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT"}"#);
        let confused = format!(
            "{header}.{}.{}",
            token.split('.').nth(1).expect("payload"),
            token.split('.').nth(2).expect("signature")
        );
        assert!(matches!(
            keys.verify(&confused, Utc::now()),
            Err(ApiError::InvalidSession)
        ));
        // A genuine signature over claims issued an hour from now.
        let now = Utc::now().timestamp();
        let claims = Claims {
            iss: ISSUER.to_owned(),
            sub: Uuid::new_v4(),
            team: Uuid::new_v4(),
            iat: now + 3600,
            exp: now + 7200,
            jti: Uuid::new_v4(),
        };
        let future = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &keys.encoding)
            .expect("a token");
        assert!(matches!(
            keys.verify(&future, Utc::now()),
            Err(ApiError::InvalidSession)
        ));
    }
}
