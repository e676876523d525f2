//! Egress policies and the host patterns they (and secrets) are made of: `api.github.com` (that name),
//! `*.example.org` (its subdomains, not the apex), each with `:PORT` or, by default, ports
//! 80 and 443. Names are lowercase DNS names; IP addresses are not patterns (a policy that
//! allowed one would let a sandbox skip DNS and the proxy's checks).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostPattern {
    /// Without the `*.`; lowercase.
    pub name: String,
    pub wildcard: bool,
    /// `None`: 80 and 443.
    pub port: Option<u16>,
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.name)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

impl HostPattern {
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let text = text.trim().to_ascii_lowercase();
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) => {
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|port| *port > 0)
                    .ok_or_else(|| format!("`{text}`: the port must be 1 to 65535"))?;
                (host.to_owned(), Some(port))
            }
            None => (text.clone(), None),
        };
        let (name, wildcard) = match host.strip_prefix("*.") {
            Some(rest) => (rest.to_owned(), true),
            None => (host, false),
        };
        let valid_label = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        let labels: Vec<&str> = name.split('.').collect();
        if name.len() > 253 || labels.len() < 2 || !labels.iter().all(|label| valid_label(label)) {
            return Err(format!(
                "`{text}` is not a host name pattern (`api.example.com`, `*.example.com`, optionally `:PORT`)"
            ));
        }
        if labels
            .last()
            .is_some_and(|tld| tld.chars().all(|c| c.is_ascii_digit()))
        {
            return Err(format!(
                "`{text}`: IP addresses are not allowed, only host names"
            ));
        }
        Ok(HostPattern {
            name,
            wildcard,
            port,
        })
    }

    /// Whether a request to `host:port` matches.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let port_ok = match self.port {
            Some(wanted) => port == wanted,
            None => port == 80 || port == 443,
        };
        let name_ok = if self.wildcard {
            host.len() > self.name.len() + 1
                && host.ends_with(&self.name)
                && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
        } else {
            host == self.name
        };
        port_ok && name_ok
    }
}

/// What a sandbox may reach: deny by default; a host matching `deny` is refused even when
/// `allow` matches it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Policy {
    pub allow: Vec<HostPattern>,
    pub deny: Vec<HostPattern>,
}

impl Policy {
    pub fn parse(allow: &[String], deny: &[String]) -> Result<Policy, String> {
        let parse = |patterns: &[String]| {
            patterns
                .iter()
                .map(|pattern| HostPattern::parse(pattern))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Policy {
            allow: parse(allow)?,
            deny: parse(deny)?,
        })
    }

    pub fn allows(&self, host: &str, port: u16) -> bool {
        !self.deny.iter().any(|pattern| pattern.matches(host, port))
            && self.allow.iter().any(|pattern| pattern.matches(host, port))
    }

    /// Whether `host` may be reached on some port (what the DNS responder answers for).
    pub fn allows_name(&self, host: &str) -> bool {
        self.allow.iter().any(|pattern| match pattern.port {
            Some(port) => self.allows(host, port),
            None => self.allows(host, 443) || self.allows(host, 80),
        })
    }
}

/// Checks a list of patterns (1 to `max`) and returns them normalized.
pub fn parse_patterns(field: &str, patterns: &[String], max: usize) -> Result<Vec<String>, String> {
    if patterns.is_empty() || patterns.len() > max {
        return Err(format!("`{field}`: 1 to {max} host patterns"));
    }
    patterns
        .iter()
        .map(|pattern| HostPattern::parse(pattern).map(|parsed| parsed.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_wins_and_nothing_is_allowed_by_default() {
        let policy = Policy::parse(
            &["*.example.org".to_owned(), "api.github.com".to_owned()],
            &["secret.example.org".to_owned()],
        )
        .unwrap();
        assert!(policy.allows("a.example.org", 443));
        assert!(!policy.allows("secret.example.org", 443));
        assert!(!policy.allows("example.com", 443));
        assert!(!Policy::default().allows("api.github.com", 443));
    }

    #[test]
    fn patterns_match_names_subdomains_and_ports() {
        let exact = HostPattern::parse("API.GitHub.com").unwrap();
        assert!(exact.matches("api.github.com", 443));
        assert!(exact.matches("api.github.com.", 80));
        assert!(!exact.matches("api.github.com", 8443));
        assert!(!exact.matches("x.api.github.com", 443));
        let wild = HostPattern::parse("*.example.org").unwrap();
        assert!(wild.matches("a.example.org", 443));
        assert!(wild.matches("a.b.example.org", 443));
        assert!(!wild.matches("example.org", 443), "not the apex");
        assert!(!wild.matches("badexample.org", 443));
        let port = HostPattern::parse("host.internal.test:8443").unwrap();
        assert!(port.matches("host.internal.test", 8443));
        assert!(!port.matches("host.internal.test", 443));
        assert_eq!(port.to_string(), "host.internal.test:8443");
        for bad in [
            "",
            "localhost",
            "10.0.0.1",
            "1.2.3.4:80",
            "*.com.",
            "a..b",
            "-a.com",
            "a.com:0",
            "a.com:99999",
            "a b.com",
            "*",
            "[::1]:443",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
    }
}
