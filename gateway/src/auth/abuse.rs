//! Limits on what anyone may try before authenticating: sign-ups (each one is starter
//! credits) and logins (each one a password guess), per address and per network, in Redis so
//! every gateway shares them. An IPv6 /64 counts as one address (a host there chooses its
//! address freely); an IPv4 /24 gets three times an address's limit.

use std::net::IpAddr;
use std::time::Duration;

use crate::error::{ApiError, ApiResult};
use crate::ratelimit::Decision;
use crate::state::AppState;

/// What an anonymous caller attempts.
#[derive(Debug, Clone, Copy)]
pub enum Attempt {
    Signup,
    Login,
}

/// What limits an address: its own bucket, and (IPv4) its /24's.
fn buckets(attempt: Attempt, ip: IpAddr, per_address: u32) -> Vec<(String, u32)> {
    let name = match attempt {
        Attempt::Signup => "signup",
        Attempt::Login => "login",
    };
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            vec![
                (format!("{name}:ip:{v4}"), per_address),
                (
                    format!("{name}:net:{a}.{b}.{c}.0/24"),
                    per_address.saturating_mul(3),
                ),
            ]
        }
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            let network = format!(
                "{:x}:{:x}:{:x}:{:x}::/64",
                segments[0], segments[1], segments[2], segments[3]
            );
            vec![(format!("{name}:net:{network}"), per_address)]
        }
    }
}

/// Counts an attempt from `ip`; 429 with `Retry-After` past a limit. When Redis cannot
/// answer, the attempt is admitted (like rate limits: capacity, not correctness).
pub async fn admit(state: &AppState, attempt: Attempt, ip: Option<IpAddr>) -> ApiResult<()> {
    let Some(ip) = ip else {
        return Ok(());
    };
    let (per_address, window) = match attempt {
        Attempt::Signup => (
            state.settings.auth.signups_per_hour,
            Duration::from_secs(3600),
        ),
        Attempt::Login => (
            state.settings.auth.logins_per_minute,
            Duration::from_secs(60),
        ),
    };
    let mut redis = state.redis.clone();
    for (bucket, count) in buckets(attempt, ip, per_address) {
        match state
            .auth
            .rate_limiter
            .check_window(&mut redis, &bucket, count, window)
            .await
        {
            Ok(Decision::Allowed) => {}
            Ok(Decision::Limited { retry_after_secs }) => {
                metrics::counter!("sandbase_abuse_limited_total").increment(1);
                return Err(ApiError::RateLimited { retry_after_secs });
            }
            Err(error) => {
                tracing::warn!(error = %error, "an abuse limit check failed; admitting the attempt");
                return Ok(());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_address_and_its_network_and_an_ipv6_network_are_limited() {
        let v4 = buckets(Attempt::Signup, "203.0.113.7".parse().unwrap(), 10);
        assert_eq!(
            v4,
            [
                ("signup:ip:203.0.113.7".to_owned(), 10),
                ("signup:net:203.0.113.0/24".to_owned(), 30)
            ]
        );
        let one = buckets(Attempt::Login, "2001:db8:1:2::1".parse().unwrap(), 30);
        let other = buckets(Attempt::Login, "2001:db8:1:2:ffff::9".parse().unwrap(), 30);
        assert_eq!(one, other);
        assert_eq!(one, [("login:net:2001:db8:1:2::/64".to_owned(), 30)]);
    }
}
