//! API keys: the `sb_<public id>_<secret>` format, hashing, what authentication keeps of
//! a key ([`KeyRecord`]) and the batched `last_used_at` writes. The cache of records and its
//! invalidation are in `key_cache`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use rand::Rng;
use rand::distr::Alphanumeric;
use sandbase_api::Role;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use subtle::ConstantTimeEq;
use uuid::Uuid;

const PREFIX: &str = "sb_";
const PUBLIC_ID_LENGTH: usize = 16;
const SECRET_LENGTH: usize = 40;

/// A parsed bearer token of the API-key form. The secret is never logged or stored.
pub struct ApiKeyToken<'a> {
    pub public_id: std::borrow::Cow<'a, str>,
    secret: std::borrow::Cow<'a, str>,
}

impl<'a> ApiKeyToken<'a> {
    /// Parses `sb_<16 lowercase alphanumerics>_<40 alphanumerics>`, without copying.
    pub fn parse(token: &'a str) -> Option<ApiKeyToken<'a>> {
        let rest = token.strip_prefix(PREFIX)?;
        let (public_id, secret) = rest.split_once('_')?;
        let public_ok = public_id.len() == PUBLIC_ID_LENGTH
            && public_id
                .bytes()
                .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit());
        let secret_ok = secret.len() == SECRET_LENGTH
            && secret.bytes().all(|byte| byte.is_ascii_alphanumeric());
        (public_ok && secret_ok).then_some(ApiKeyToken {
            public_id: public_id.into(),
            secret: secret.into(),
        })
    }

    /// A new random key: a 16-character public id and a 40-character secret (~238 bits).
    pub fn generate() -> ApiKeyToken<'static> {
        let mut rng = rand::rng();
        let public_id: String = (0..PUBLIC_ID_LENGTH)
            .map(|_| {
                const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
                char::from(ALPHABET[rng.random_range(0..ALPHABET.len())])
            })
            .collect();
        let secret: String = (&mut rng)
            .sample_iter(Alphanumeric)
            .take(SECRET_LENGTH)
            .map(char::from)
            .collect();
        ApiKeyToken {
            public_id: public_id.into(),
            secret: secret.into(),
        }
    }

    /// The full token, to hand to the caller exactly once.
    pub fn reveal(&self) -> String {
        format!("{PREFIX}{}_{}", self.public_id, self.secret)
    }

    /// SHA-256 of the secret. The secret is 238 random bits, so a fast hash is enough:
    /// there is nothing to brute-force.
    pub fn secret_hash(&self) -> [u8; 32] {
        Sha256::digest(self.secret.as_bytes()).into()
    }

    /// Constant-time comparison of this token's secret with a stored hash.
    pub fn matches(&self, stored_hash: &[u8]) -> bool {
        bool::from(self.secret_hash().as_slice().ct_eq(stored_hash))
    }
}

/// What authentication needs to know about a key, as cached.
#[derive(Debug)]
pub struct KeyRecord {
    pub id: Uuid,
    pub team_id: Uuid,
    pub public_id: String,
    pub secret_hash: Vec<u8>,
    pub role: Role,
    pub created_by: Option<Uuid>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked: bool,
    pub rate_limit: Option<(u32, u32)>,
    /// The key's spend cap, in micro-credits.
    pub max_credits: Option<i64>,
    /// Whether the key was made by another key (its lineage is not empty).
    pub has_parent: bool,
    /// What `GET /v1/me` shows, cached so that answering it needs no Postgres round trip.
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub team: sandbase_api::Team,
    pub creator: Option<sandbase_api::User>,
    /// Unix second of the last use handed to [`LastUsed`], so a busy key touches the
    /// shared map once a second rather than on every request.
    last_touched: AtomicI64,
    /// Rate-limit tokens this gateway holds for the key.
    pub lease: Arc<crate::ratelimit::Lease>,
}

impl KeyRecord {
    /// Records a use, at most once per second per key.
    pub fn touch(&self, last_used: &LastUsed, now: DateTime<Utc>) {
        let second = now.timestamp();
        if self.last_touched.swap(second, Ordering::Relaxed) != second {
            last_used.touch(self.id, now);
        }
    }

    /// The key as listed by the API, with `last_used` as its last use.
    pub fn to_api(&self, last_used: Option<DateTime<Utc>>) -> sandbase_api::ApiKey {
        sandbase_api::ApiKey {
            id: self.id,
            public_id: self.public_id.clone(),
            name: self.name.clone(),
            role: self.role,
            created_by: self.created_by,
            created_at: self.created_at,
            last_used_at: last_used,
            expires_at: self.expires_at,
            max_credits_micro: self.max_credits,
            spent_micro: None,
            allowed_models: None,
        }
    }

    /// Loads a key (revoked or not) with its team's rate limit.
    pub async fn load(db: &PgPool, public_id: &str) -> Result<Option<KeyRecord>, sqlx::Error> {
        let row: Option<KeyRow> = sqlx::query_as(
            "SELECT k.id, k.team_id, k.public_id, k.secret_hash, k.role, k.created_by, \
                    k.expires_at, k.revoked_at IS NOT NULL AS revoked, k.max_credits, \
                    cardinality(k.lineage) > 0 AS has_parent, \
                    t.rate_limit_per_sec, t.rate_limit_burst, k.name, k.created_at, \
                    t.name AS team_name, t.created_at AS team_created_at, \
                    u.email AS creator_email, u.created_at AS creator_created_at \
             FROM api_keys k JOIN teams t ON t.id = k.team_id \
             LEFT JOIN users u ON u.id = k.created_by \
             WHERE k.public_id = $1",
        )
        .bind(public_id)
        .fetch_optional(db)
        .await?;
        Ok(row.map(KeyRow::into_record))
    }
}

#[derive(sqlx::FromRow)]
struct KeyRow {
    id: Uuid,
    team_id: Uuid,
    public_id: String,
    secret_hash: Vec<u8>,
    role: String,
    created_by: Option<Uuid>,
    expires_at: Option<DateTime<Utc>>,
    revoked: bool,
    max_credits: Option<i64>,
    has_parent: bool,
    rate_limit_per_sec: Option<i32>,
    rate_limit_burst: Option<i32>,
    name: String,
    created_at: DateTime<Utc>,
    team_name: String,
    team_created_at: DateTime<Utc>,
    creator_email: Option<String>,
    creator_created_at: Option<DateTime<Utc>>,
}

impl KeyRow {
    fn into_record(self) -> KeyRecord {
        let rate_limit = team_rate_limit(self.rate_limit_per_sec, self.rate_limit_burst);
        KeyRecord {
            id: self.id,
            team_id: self.team_id,
            public_id: self.public_id,
            secret_hash: self.secret_hash,
            // The column has a CHECK constraint; an unknown value would be a schema bug,
            // and the least privilege is the safe reading of it.
            role: self.role.parse().unwrap_or(Role::Member),
            created_by: self.created_by,
            expires_at: self.expires_at,
            revoked: self.revoked,
            rate_limit,
            max_credits: self.max_credits,
            has_parent: self.has_parent,
            name: self.name,
            created_at: self.created_at,
            team: sandbase_api::Team {
                id: self.team_id,
                name: self.team_name,
                created_at: self.team_created_at,
            },
            creator: match (self.created_by, self.creator_email, self.creator_created_at) {
                (Some(id), Some(email), Some(created_at)) => Some(sandbase_api::User {
                    id,
                    email,
                    created_at,
                }),
                _ => None,
            },
            last_touched: AtomicI64::new(0),
            lease: Arc::default(),
        }
    }
}

/// A team's rate-limit override from its row; `None` when the team uses the defaults.
/// A rate without a burst allows one second's worth at once.
pub fn team_rate_limit(per_second: Option<i32>, burst: Option<i32>) -> Option<(u32, u32)> {
    let per_second = u32::try_from(per_second?).ok()?.max(1);
    let burst = burst
        .and_then(|burst| u32::try_from(burst).ok())
        .unwrap_or(per_second)
        .max(1);
    Some((per_second, burst))
}

/// Batches `last_used_at` updates so authentication never waits on a Postgres write.
#[derive(Default)]
pub struct LastUsed {
    pending: Mutex<HashMap<Uuid, DateTime<Utc>>>,
}

impl LastUsed {
    pub fn touch(&self, key_id: Uuid, at: DateTime<Utc>) {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pending.insert(key_id, at);
    }

    /// Writes what accumulated since the last flush in one statement.
    pub async fn flush(&self, db: &PgPool) -> Result<(), sqlx::Error> {
        let batch: Vec<(Uuid, DateTime<Utc>)> = {
            let mut pending = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            pending.drain().collect()
        };
        if batch.is_empty() {
            return Ok(());
        }
        let (ids, times): (Vec<Uuid>, Vec<DateTime<Utc>>) = batch.into_iter().unzip();
        sqlx::query(
            "UPDATE api_keys k SET last_used_at = GREATEST(COALESCE(k.last_used_at, u.at), u.at) \
             FROM UNNEST($1::uuid[], $2::timestamptz[]) AS u(id, at) WHERE k.id = u.id",
        )
        .bind(&ids)
        .bind(&times)
        .execute(db)
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_parse_back() {
        let token = ApiKeyToken::generate();
        let text = token.reveal();
        let parsed = ApiKeyToken::parse(&text).expect("parses");
        assert_eq!(parsed.public_id, token.public_id);
        assert!(parsed.matches(&token.secret_hash()));
    }

    #[test]
    fn malformed_tokens_do_not_parse() {
        let good = ApiKeyToken::generate().reveal();
        for bad in [
            "",
            "sb_",
            "sk_abc_def",
            &good[..good.len() - 1],
            &format!("{good}x"),
            &good.replace("sb_", "SB_"),
            &format!("sb_{}_{}", "A".repeat(16), "a".repeat(40)),
            &format!("sb_{}_{}", "a".repeat(16), "a-".repeat(20)),
        ] {
            assert!(
                ApiKeyToken::parse(bad).is_none(),
                "{bad:?} should not parse"
            );
        }
    }
}
