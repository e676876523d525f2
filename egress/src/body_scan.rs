//! Placeholders in a request body, seen as it streams ([`BodyScan`]): swapped for their
//! credential's value on the way to its host, stopping the request on the way anywhere else.

use zeroize::Zeroizing;

use crate::credentials::{Credential, contains, find};

/// Placeholders in a request body, seen as it streams: swapped for their values when the
/// request's host is theirs, stopping the request when it is not. The last bytes of each
/// chunk are held back until the next one (or the end), so a placeholder split across
/// chunks is seen whole and no part of one that must not leave is ever sent.
pub struct BodyScan {
    rules: Vec<BodyRule>,
    held: Vec<u8>,
    /// The longest placeholder's length, less one: what may be the start of one.
    keep: usize,
}

struct BodyRule {
    name: String,
    placeholder: Vec<u8>,
    /// `None`: not for this host, a leak.
    value: Option<Zeroizing<Vec<u8>>>,
}

/// What a body scan does with a credential's placeholder.
enum BodyAction {
    /// Swap it for the value (bound to the host, opted in for the path).
    Swap,
    /// Let it through as it is (bound to the host, not swapped in bodies there).
    Pass,
    /// Stop the request (bound elsewhere).
    Stop,
}

impl BodyScan {
    /// The scan for a request to `host:port` for `path` over TLS; `None` when no
    /// placeholder needs looking for.
    pub fn new(credentials: &[Credential], host: &str, port: u16, path: &str) -> Option<BodyScan> {
        BodyScan::with(credentials, |credential| {
            if !credential.binds(host, port) {
                BodyAction::Stop
            } else if credential.swaps_body(path) {
                BodyAction::Swap
            } else {
                BodyAction::Pass
            }
        })
    }

    /// The scan for a plain-text request: every placeholder is a leak.
    pub fn plain(credentials: &[Credential]) -> Option<BodyScan> {
        BodyScan::with(credentials, |_| BodyAction::Stop)
    }

    fn with(
        credentials: &[Credential],
        action: impl Fn(&Credential) -> BodyAction,
    ) -> Option<BodyScan> {
        let rules: Vec<BodyRule> = credentials
            .iter()
            .filter_map(|credential| {
                let placeholder = credential.placeholder()?;
                let value = match action(credential) {
                    BodyAction::Pass => return None,
                    BodyAction::Swap => {
                        Some(Zeroizing::new(credential.value().as_bytes().to_vec()))
                    }
                    BodyAction::Stop => None,
                };
                Some(BodyRule {
                    name: credential.name.clone(),
                    placeholder: placeholder.as_bytes().to_vec(),
                    value,
                })
            })
            .collect();
        let longest = rules.iter().map(|rule| rule.placeholder.len()).max()?;
        Some(BodyScan {
            rules,
            held: Vec::new(),
            keep: longest.saturating_sub(1),
        })
    }

    /// Whether swapping keeps the body's length (every value as long as its placeholder):
    /// then its `Content-Length` stands.
    pub fn keeps_length(&self) -> bool {
        self.rules.iter().all(|rule| {
            rule.value
                .as_ref()
                .is_none_or(|value| value.len() == rule.placeholder.len())
        })
    }

    /// The next chunk: what may be sent now, or the credential whose placeholder must not go
    /// to this host.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, String> {
        self.held.extend_from_slice(chunk);
        self.swap()?;
        let ready = self.held.len().saturating_sub(self.keep);
        Ok(self.held.drain(..ready).collect())
    }

    /// What was held back, at the end of the body.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }

    /// The credential whose placeholder must not go where `text` goes, if `text` holds one.
    pub fn stopped_by(&self, text: &[u8]) -> Option<String> {
        self.rules
            .iter()
            .find(|rule| rule.value.is_none() && contains(text, &rule.placeholder))
            .map(|rule| rule.name.clone())
    }

    fn swap(&mut self) -> Result<(), String> {
        for rule in &self.rules {
            let Some(at) = find(&self.held, &rule.placeholder) else {
                continue;
            };
            let Some(value) = &rule.value else {
                return Err(rule.name.clone());
            };
            let mut swapped = Vec::with_capacity(self.held.len());
            let mut rest = at;
            swapped.extend_from_slice(&self.held[..rest]);
            loop {
                swapped.extend_from_slice(value);
                rest += rule.placeholder.len();
                match find(&self.held[rest..], &rule.placeholder) {
                    Some(next) => {
                        swapped.extend_from_slice(&self.held[rest..rest + next]);
                        rest += next;
                    }
                    None => break,
                }
            }
            swapped.extend_from_slice(&self.held[rest..]);
            self.held = swapped;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::{Injection, default_placeholder_headers, placeholder_for};
    use crate::policy::HostPattern;

    #[test]
    fn body_placeholders_are_swapped_across_chunks_and_stopped_for_other_hosts() {
        let bound = Credential::new(
            "git".to_owned(),
            vec![HostPattern::parse("git.example.com").unwrap()],
            Injection::Placeholder {
                env: "GIT_TOKEN".to_owned(),
                placeholder: "ghp_PLACEHOLDERxxxxxxxxxxxxxxxx".to_owned(),
                in_body: true,
                in_url: false,
                paths: vec!["/repos/*".to_owned()],
                headers: default_placeholder_headers(),
            },
            Zeroizing::new("ghp_realvalue0123456789abcdefgh".to_owned()),
        );
        let credentials = [bound];
        let body = b"{\"token\": \"ghp_PLACEHOLDERxxxxxxxxxxxxxxxx\", \"again\": \"ghp_PLACEHOLDERxxxxxxxxxxxxxxxx\"}";
        // Every way of cutting the body in two: the value arrives whole, twice.
        for cut in 0..body.len() {
            let mut scan = BodyScan::new(&credentials, "git.example.com", 443, "/repos/x").unwrap();
            assert!(scan.keeps_length());
            let mut sent = scan.push(&body[..cut]).unwrap();
            sent.extend(scan.push(&body[cut..]).unwrap());
            sent.extend(scan.finish());
            assert_eq!(
                String::from_utf8(sent).unwrap(),
                "{\"token\": \"ghp_realvalue0123456789abcdefgh\", \"again\": \"ghp_realvalue0123456789abcdefgh\"}",
                "cut at {cut}"
            );
        }
        // Bound, but not opted in for this path: passed as it is (nothing to scan for).
        assert!(BodyScan::new(&credentials, "git.example.com", 443, "/gists").is_none());
        // To another host: stopped, and no byte of the placeholder left before that.
        let start = find(body, b"ghp_PLACEHOLDER").unwrap();
        for cut in 0..body.len() {
            let mut scan =
                BodyScan::new(&credentials, "other.example.com", 443, "/repos/x").unwrap();
            let mut sent = Vec::new();
            let outcome = scan.push(&body[..cut]).and_then(|first| {
                sent.extend(first);
                scan.push(&body[cut..])
            });
            assert_eq!(outcome, Err("git".to_owned()), "cut at {cut}");
            assert!(sent.len() <= start, "cut at {cut}: {sent:?}");
        }
        // In plain text the bound host is stopped too: values only travel over TLS.
        let mut scan = BodyScan::plain(&credentials).unwrap();
        assert_eq!(scan.push(body), Err("git".to_owned()));
        // No placeholders, no scan; a value of another length changes the body's length.
        let header = Credential::new(
            "api".to_owned(),
            vec![HostPattern::parse("api.example.com").unwrap()],
            Injection::Basic {
                username: "u".to_owned(),
            },
            Zeroizing::new("s3cr3t value".to_owned()),
        );
        assert!(BodyScan::new(&[header], "api.example.com", 443, "/").is_none());
        let short = Credential::new(
            "short".to_owned(),
            vec![HostPattern::parse("git.example.com").unwrap()],
            Injection::Placeholder {
                env: "SHORT".to_owned(),
                placeholder: placeholder_for("abc"),
                in_body: true,
                in_url: false,
                paths: vec!["*".to_owned()],
                headers: default_placeholder_headers(),
            },
            Zeroizing::new("abc".to_owned()),
        );
        assert!(
            !BodyScan::new(&[short], "git.example.com", 443, "/")
                .unwrap()
                .keeps_length()
        );
    }
}
