//! A sandbox's credentials as the proxy holds them: the value (in memory only, zeroed when
//! dropped), the hosts it is for, and how it goes into a request — a header, basic
//! authentication, a query parameter, or a placeholder the sandbox sees instead of the value
//! and the proxy swaps on the way out. A placeholder on its way to any other host stops the
//! request.

use base64::Engine as _;
use http::header::{AUTHORIZATION, HeaderName, HeaderValue};
use http::request::Parts;
use rand::Rng as _;
use zeroize::Zeroizing;

use crate::policy::HostPattern;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Injection {
    /// Set (or overwrite) `name` to `format` with `{value}` replaced.
    Header {
        #[serde(with = "header_name")]
        name: HeaderName,
        format: String,
    },
    /// `Authorization: Basic base64(username:value)`.
    Basic { username: String },
    /// Set the query parameter to the value.
    Query { parameter: String },
    /// The sandbox's environment variable `env` holds `placeholder`, swapped for the value in
    /// the headers of requests to the credential's hosts; in their bodies (`in_body`) and
    /// targets (`in_url`) only on `paths`.
    Placeholder {
        env: String,
        placeholder: String,
        #[serde(default)]
        in_body: bool,
        #[serde(default)]
        in_url: bool,
        #[serde(default)]
        paths: Vec<String>,
        /// The headers it is swapped in (the credential names them; by default the usual
        /// credential headers, [`DEFAULT_PLACEHOLDER_HEADERS`]). In any other header it
        /// stays a placeholder, so an upstream echoing a header of the sandbox's choosing
        /// never hands back the value.
        #[serde(default = "default_placeholder_headers")]
        headers: Vec<String>,
    },
}

/// Where a placeholder is swapped when its credential names no headers.
pub const DEFAULT_PLACEHOLDER_HEADERS: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "private-token",
    "x-auth-token",
];

pub fn default_placeholder_headers() -> Vec<String> {
    DEFAULT_PLACEHOLDER_HEADERS.map(str::to_owned).to_vec()
}

/// Whether a request path is one of `patterns`: equal, or starting with a pattern's text
/// before its final `*`.
pub fn path_allowed(patterns: &[String], path: &str) -> bool {
    patterns
        .iter()
        .any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => path == pattern,
        })
}

mod header_name {
    use http::header::HeaderName;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(name: &HeaderName, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(name.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<HeaderName, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A credential as it travels from the worker to its proxy process (the value zeroed when
/// dropped, never printed).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct CredentialSpec {
    pub name: String,
    pub hosts: Vec<HostPattern>,
    pub injection: Injection,
    pub value: Zeroizing<String>,
}

impl std::fmt::Debug for CredentialSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialSpec")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl From<CredentialSpec> for Credential {
    fn from(spec: CredentialSpec) -> Credential {
        Credential::new(spec.name, spec.hosts, spec.injection, spec.value)
    }
}

pub struct Credential {
    pub name: String,
    pub hosts: Vec<HostPattern>,
    pub injection: Injection,
    value: Zeroizing<String>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("injection", &self.injection)
            .finish_non_exhaustive()
    }
}

impl Credential {
    pub fn new(
        name: String,
        hosts: Vec<HostPattern>,
        injection: Injection,
        value: Zeroizing<String>,
    ) -> Credential {
        Credential {
            name,
            hosts,
            injection,
            value,
        }
    }

    pub fn binds(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|pattern| pattern.matches(host, port))
    }

    pub fn placeholder(&self) -> Option<&str> {
        match &self.injection {
            Injection::Placeholder { placeholder, .. } => Some(placeholder),
            _ => None,
        }
    }

    /// The value, for the response scrub.
    pub(crate) fn value(&self) -> &str {
        &self.value
    }

    /// Whether the placeholder is swapped in the body of a request for `path`.
    pub(crate) fn swaps_body(&self, path: &str) -> bool {
        matches!(&self.injection, Injection::Placeholder { in_body: true, paths, .. } if path_allowed(paths, path))
    }

    /// Whether the placeholder is swapped in the target of a request for `path`.
    fn swaps_url(&self, path: &str) -> bool {
        matches!(&self.injection, Injection::Placeholder { in_url: true, paths, .. } if path_allowed(paths, path))
    }
}

/// A stand-in that looks like `value`: the same leading scheme (`ghp_`, `sk-`, `xoxb-` …, up
/// to 8 characters ending in `_` or `-`) and length, the rest random letters and digits.
/// Only the scheme is shared, never a character of the secret itself.
pub fn placeholder_for(value: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let scheme_end = value
        .char_indices()
        .take(8)
        .filter(|(_, c)| *c == '_' || *c == '-')
        .map(|(index, _)| index + 1)
        .last()
        .filter(|end| {
            value[..*end]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
        .unwrap_or(0);
    let scheme = &value[..scheme_end];
    let length = value.chars().count().clamp(scheme.len() + 24, 256);
    let mut rng = rand::rng();
    let mut placeholder = scheme.to_owned();
    while placeholder.len() < length {
        placeholder.push(char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]));
    }
    placeholder
}

/// What became of a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Forward it; these credentials were added.
    Forward(Vec<String>),
    /// Stop it: the placeholder of this credential was on its way to another host.
    Leak(String),
}

/// Injects the credentials bound to `host:port` into a request head and checks it carries no
/// other credential's placeholder (in its target or any header).
pub fn apply(credentials: &[Credential], host: &str, port: u16, parts: &mut Parts) -> Outcome {
    if let Some(name) = placeholder_leaving(credentials, |c| c.binds(host, port), parts) {
        return Outcome::Leak(name);
    }
    let mut injected = Vec::new();
    for credential in credentials.iter().filter(|c| c.binds(host, port)) {
        let value = credential.value.as_str();
        let done = match &credential.injection {
            Injection::Header { name, format } => {
                let text = Zeroizing::new(format.replace("{value}", value));
                set_header(parts, name.clone(), &text)
            }
            Injection::Basic { username } => {
                let pair = Zeroizing::new(format!("{username}:{value}"));
                let text = Zeroizing::new(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair.as_bytes())
                ));
                set_header(parts, AUTHORIZATION, &text)
            }
            Injection::Query { parameter } => set_query(parts, parameter, value),
            Injection::Placeholder {
                placeholder,
                headers,
                ..
            } => {
                let in_url = credential.swaps_url(parts.uri.path());
                swap(parts, placeholder, value, in_url, headers)
            }
        };
        if done {
            injected.push(credential.name.clone());
        }
    }
    Outcome::Forward(injected)
}

/// The credential whose placeholder a plain-text request carries, if any: credentials only
/// ever travel over TLS, so every placeholder in plain text is one leaving.
pub fn placeholder_in_plain(credentials: &[Credential], parts: &Parts) -> Option<String> {
    placeholder_leaving(credentials, |_| false, parts)
}

/// The first credential not `bound` to the request's destination whose placeholder is in its
/// target or a header.
fn placeholder_leaving(
    credentials: &[Credential],
    bound: impl Fn(&Credential) -> bool,
    parts: &Parts,
) -> Option<String> {
    let target = parts.uri.to_string();
    credentials
        .iter()
        .filter(|credential| !bound(credential))
        .find(|credential| {
            credential.placeholder().is_some_and(|placeholder| {
                target.contains(placeholder)
                    || parts
                        .headers
                        .values()
                        .any(|value| contains(value.as_bytes(), placeholder.as_bytes()))
            })
        })
        .map(|credential| credential.name.clone())
}

pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

fn set_header(parts: &mut Parts, name: HeaderName, text: &str) -> bool {
    match HeaderValue::from_str(text) {
        Ok(mut value) => {
            value.set_sensitive(true);
            parts.headers.insert(name, value);
            true
        }
        Err(_) => false,
    }
}

/// Sets `parameter` (replacing every earlier occurrence) in the request's query.
fn set_query(parts: &mut Parts, parameter: &str, value: &str) -> bool {
    let path = parts.uri.path().to_owned();
    let mut pairs: Vec<String> = parts
        .uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some(parameter))
        .map(str::to_owned)
        .collect();
    pairs.push(format!("{}={}", encode(parameter), encode(value)));
    let target = format!("{path}?{}", pairs.join("&"));
    match target.parse() {
        Ok(uri) => {
            parts.uri = uri;
            true
        }
        Err(_) => false,
    }
}

pub(crate) fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// Replaces the placeholder with the value in the `named` headers, and in the target when
/// `in_url`.
fn swap(parts: &mut Parts, placeholder: &str, value: &str, in_url: bool, named: &[String]) -> bool {
    let mut swapped = false;
    let target = parts.uri.to_string();
    if in_url
        && target.contains(placeholder)
        && let Ok(uri) = target.replace(placeholder, &encode(value)).parse()
    {
        parts.uri = uri;
        swapped = true;
    }
    for (name, header) in parts.headers.iter_mut() {
        if !named
            .iter()
            .any(|named| named.eq_ignore_ascii_case(name.as_str()))
        {
            continue;
        }
        let Ok(text) = header.to_str() else { continue };
        if text.contains(placeholder) {
            let replaced = Zeroizing::new(text.replace(placeholder, value));
            if let Ok(mut new) = HeaderValue::from_str(&replaced) {
                new.set_sensitive(true);
                *header = new;
                swapped = true;
            }
        }
    }
    swapped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(name: &str, host: &str, injection: Injection) -> Credential {
        Credential::new(
            name.to_owned(),
            vec![HostPattern::parse(host).unwrap()],
            injection,
            Zeroizing::new("s3cr3t value".to_owned()),
        )
    }

    fn parts(target: &str, headers: &[(&str, &str)]) -> Parts {
        let mut builder = http::Request::builder().uri(target);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn placeholders_look_like_the_value_without_sharing_it() {
        let value = "ghp_0123456789abcdefghijklmnopqrstuvwxyz";
        let placeholder = placeholder_for(value);
        assert!(placeholder.starts_with("ghp_"));
        assert_eq!(placeholder.len(), value.len());
        assert_ne!(placeholder, value);
        assert!(!placeholder.contains("0123456789abcdef"));
        let short = placeholder_for("x");
        assert_eq!(short.len(), 24);
        assert!(placeholder_for("sk-proj-abc").starts_with("sk-proj-"));
    }

    #[test]
    fn each_mode_injects_only_for_its_hosts() {
        let credentials = vec![
            credential(
                "header",
                "api.example.com",
                Injection::Header {
                    name: AUTHORIZATION,
                    format: "Bearer {value}".to_owned(),
                },
            ),
            credential(
                "basic",
                "basic.example.com",
                Injection::Basic {
                    username: "me".to_owned(),
                },
            ),
            credential(
                "query",
                "query.example.com",
                Injection::Query {
                    parameter: "key".to_owned(),
                },
            ),
        ];
        let mut request = parts("/v1?a=1", &[("authorization", "Bearer fake")]);
        assert_eq!(
            apply(&credentials, "api.example.com", 443, &mut request),
            Outcome::Forward(vec!["header".to_owned()])
        );
        assert_eq!(request.headers[AUTHORIZATION], "Bearer s3cr3t value");
        let mut request = parts("/", &[]);
        apply(&credentials, "basic.example.com", 443, &mut request);
        assert_eq!(request.headers[AUTHORIZATION], "Basic bWU6czNjcjN0IHZhbHVl");
        let mut request = parts("/x?key=old&b=2", &[]);
        apply(&credentials, "query.example.com", 443, &mut request);
        assert_eq!(request.uri.to_string(), "/x?b=2&key=s3cr3t%20value");
        let mut request = parts("/", &[("authorization", "Bearer fake")]);
        assert_eq!(
            apply(&credentials, "other.example.com", 443, &mut request),
            Outcome::Forward(Vec::new())
        );
        assert_eq!(request.headers[AUTHORIZATION], "Bearer fake");
    }

    #[test]
    fn placeholders_are_swapped_for_their_hosts_and_stop_requests_to_others() {
        let placeholder = |in_url: bool| Injection::Placeholder {
            env: "GITHUB_TOKEN".to_owned(),
            placeholder: "ghp_PLACEHOLDER000000000000".to_owned(),
            in_body: false,
            in_url,
            paths: vec!["/user".to_owned()],
            headers: crate::credentials::default_placeholder_headers(),
        };
        let credentials = vec![credential("github", "api.github.com", placeholder(false))];
        let mut request = parts(
            "/user?t=ghp_PLACEHOLDER000000000000",
            &[("authorization", "token ghp_PLACEHOLDER000000000000")],
        );
        assert_eq!(
            apply(&credentials, "api.github.com", 443, &mut request),
            Outcome::Forward(vec!["github".to_owned()])
        );
        assert_eq!(request.headers[AUTHORIZATION], "token s3cr3t value");
        // Only in the headers the credential names: in one of the sandbox's choosing (which
        // an upstream may echo back) it stays a placeholder.
        let mut echoed = parts(
            "/user",
            &[
                ("x-echo-me", "ghp_PLACEHOLDER000000000000"),
                ("x-api-key", "ghp_PLACEHOLDER000000000000"),
            ],
        );
        apply(&credentials, "api.github.com", 443, &mut echoed);
        assert_eq!(echoed.headers["x-echo-me"], "ghp_PLACEHOLDER000000000000");
        assert_eq!(echoed.headers["x-api-key"], "s3cr3t value");
        // In the URL only when opted in, and only for the paths named.
        assert_eq!(
            request.uri.to_string(),
            "/user?t=ghp_PLACEHOLDER000000000000"
        );
        let opted = vec![credential("github", "api.github.com", placeholder(true))];
        for (target, swapped) in [
            (
                "/user?t=ghp_PLACEHOLDER000000000000",
                "/user?t=s3cr3t%20value",
            ),
            (
                "/users?t=ghp_PLACEHOLDER000000000000",
                "/users?t=ghp_PLACEHOLDER000000000000",
            ),
        ] {
            let mut request = parts(target, &[]);
            apply(&opted, "api.github.com", 443, &mut request);
            assert_eq!(request.uri.to_string(), swapped);
        }
        for (target, headers) in [
            ("/?q=ghp_PLACEHOLDER000000000000", vec![]),
            ("/", vec![("x-token", "ghp_PLACEHOLDER000000000000")]),
        ] {
            let mut request = parts(target, &headers);
            assert_eq!(
                apply(&credentials, "evil.example.com", 443, &mut request),
                Outcome::Leak("github".to_owned())
            );
        }
        // In plain text not even the bound host may have it.
        let request = parts(
            "http://api.github.com/user",
            &[("authorization", "token ghp_PLACEHOLDER000000000000")],
        );
        assert_eq!(
            placeholder_in_plain(&credentials, &request),
            Some("github".to_owned())
        );
        assert_eq!(
            placeholder_in_plain(&credentials, &parts("http://api.github.com/", &[])),
            None
        );
    }
}
