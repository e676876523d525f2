//! Failed authentications, audited in aggregate: the first failure of an address and
//! credential (the public part of a key, `session`, `none`) is written at once; the rest of
//! its window are counted in memory and written as one row with their count when the window
//! ends, so a flood of bogus requests adds a handful of rows, not one each.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// Whose failures are counted together.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FailureKey {
    pub source_ip: Option<IpAddr>,
    /// `sb_<public id>`, `session`, `none` or `other`; never a secret.
    pub credential: String,
    /// The team of the key, when the key was known.
    pub team_id: Option<Uuid>,
}

/// What the row of a window's further failures says.
#[derive(Debug, Clone)]
pub struct Summary {
    pub key: FailureKey,
    /// Failures after the first, in the window.
    pub count: u64,
    pub target: String,
    pub status_code: u16,
    pub window: Duration,
}

struct Window {
    opened: Instant,
    more: u64,
    target: String,
    status_code: u16,
}

pub struct FailedAuthBook {
    window: Duration,
    open: Mutex<HashMap<FailureKey, Window>>,
    /// Windows that ended with failures not written yet.
    closed: Mutex<Vec<Summary>>,
}

/// Most windows kept open at once; beyond, failures are still answered, the oldest counts
/// written early (memory stays bounded under a flood from many addresses).
const MAX_OPEN: usize = 10_000;

impl FailedAuthBook {
    pub fn new(window: Duration) -> FailedAuthBook {
        FailedAuthBook {
            window,
            open: Mutex::new(HashMap::new()),
            closed: Mutex::new(Vec::new()),
        }
    }

    /// Counts a failure; `true` when it opens a window, whose first row is written at once.
    pub fn note(&self, key: FailureKey, target: &str, status_code: u16) -> bool {
        let mut open = lock(&self.open);
        if let Some(window) = open.get_mut(&key) {
            if window.opened.elapsed() < self.window {
                window.more += 1;
                return false;
            }
            let ended = open.remove(&key);
            self.close(&key, ended);
        }
        if open.len() >= MAX_OPEN {
            let keys: Vec<FailureKey> = open.keys().cloned().collect();
            for old in keys {
                let ended = open.remove(&old);
                self.close(&old, ended);
            }
        }
        open.insert(
            key,
            Window {
                opened: Instant::now(),
                more: 0,
                target: target.to_owned(),
                status_code,
            },
        );
        true
    }

    fn close(&self, key: &FailureKey, window: Option<Window>) {
        if let Some(window) = window.filter(|window| window.more > 0) {
            lock(&self.closed).push(Summary {
                key: key.clone(),
                count: window.more,
                target: window.target,
                status_code: window.status_code,
                window: self.window,
            });
        }
    }

    /// The windows that ended with further failures, to be written.
    pub fn take_due(&self) -> Vec<Summary> {
        {
            let mut open = lock(&self.open);
            let ended: Vec<FailureKey> = open
                .iter()
                .filter(|(_, window)| window.opened.elapsed() >= self.window)
                .map(|(key, _)| key.clone())
                .collect();
            for key in ended {
                let window = open.remove(&key);
                self.close(&key, window);
            }
        }
        std::mem::take(&mut *lock(&self.closed))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes the summary rows of the windows that ended.
pub async fn flush(book: &FailedAuthBook, db: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    let due = book.take_due();
    if due.is_empty() {
        return Ok(());
    }
    let mut connection = db.acquire().await?;
    for summary in due {
        crate::audit::insert(
            &mut connection,
            &crate::audit::Entry {
                team_id: summary.key.team_id,
                actor_type: "anonymous",
                actor_id: None,
                action: "auth.failed".to_owned(),
                target: Some(summary.target),
                outcome: "denied",
                status_code: Some(summary.status_code),
                details: serde_json::json!({
                    "count": summary.count,
                    "aggregated": true,
                    "window_secs": summary.window.as_secs(),
                    "credential": summary.key.credential,
                }),
            },
            None,
            summary.key.source_ip,
        )
        .await?;
    }
    Ok(())
}

/// What a request's `Authorization` header names, safe to keep: the public part of an API
/// key, `session` for a session token, `none`, or `other`.
pub fn credential_label(authorization: Option<&str>) -> String {
    let Some(value) = authorization else {
        return "none".to_owned();
    };
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .unwrap_or(value)
        .trim();
    if let Some(rest) = token.strip_prefix("sb_") {
        let public: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .take(16)
            .collect();
        return format!("sb_{public}");
    }
    if token.matches('.').count() == 2 {
        return "session".to_owned();
    }
    "other".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(credential: &str) -> FailureKey {
        FailureKey {
            source_ip: Some("203.0.113.1".parse().unwrap()),
            credential: credential.to_owned(),
            team_id: None,
        }
    }

    #[test]
    fn the_first_failure_opens_a_window_and_the_rest_become_one_count() {
        let book = FailedAuthBook::new(Duration::from_millis(50));
        assert!(book.note(key("sb_a"), "GET /v1/me", 401));
        for _ in 0..99 {
            assert!(!book.note(key("sb_a"), "GET /v1/me", 401));
        }
        assert!(
            book.note(key("sb_b"), "GET /v1/me", 401),
            "another credential"
        );
        assert!(book.take_due().is_empty(), "the window is still open");
        std::thread::sleep(Duration::from_millis(60));
        let due = book.take_due();
        assert_eq!(
            due.len(),
            1,
            "a window with only its first failure writes nothing more"
        );
        assert_eq!((due[0].key.credential.as_str(), due[0].count), ("sb_a", 99));
        assert!(book.note(key("sb_a"), "GET /v1/me", 401), "a new window");
    }

    #[test]
    fn labels_never_carry_a_secret() {
        let token = "Bearer sb_abcdefghijklmnop_SECRETSECRETSECRETSECRETSECRETSECRET12";
        assert_eq!(credential_label(Some(token)), "sb_abcdefghijklmnop");
        assert_eq!(credential_label(Some("Bearer a.b.c")), "session");
        assert_eq!(credential_label(None), "none");
        assert_eq!(credential_label(Some("Basic dXNlcjpwYXNz")), "other");
    }
}
