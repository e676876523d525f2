//! An address block (`10.0.0.0/8`, `2001:db8::/32`, or one address), as configured for
//! trusted proxies.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, address) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(network) & mask == u32::from(address) & mask
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(network) & mask == u128::from(address) & mask
            }
            (IpAddr::V6(network), IpAddr::V4(address)) => {
                // An IPv4 peer on a dual-stack socket, against an IPv4-mapped block.
                self.prefix >= 96
                    && Cidr {
                        network: network.to_canonical(),
                        prefix: self.prefix - 96,
                    }
                    .contains(IpAddr::V4(address))
            }
            (IpAddr::V4(_), IpAddr::V6(address)) => match address.to_canonical() {
                IpAddr::V4(address) => self.contains(IpAddr::V4(address)),
                IpAddr::V6(_) => false,
            },
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not an address or address block"))?;
        let longest = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => longest,
            Some(prefix) => prefix
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|prefix| *prefix <= longest)
                .ok_or_else(|| format!("`{text}` has a prefix length out of 0..={longest}"))?,
        };
        Ok(Cidr { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.network, self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_contain_their_addresses_only() {
        let cidr = |text: &str| text.parse::<Cidr>().unwrap();
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        assert!(cidr("10.0.0.0/8").contains(ip("10.255.1.2")));
        assert!(!cidr("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.1")));
        assert!(cidr("192.0.2.7").contains(ip("192.0.2.7")));
        assert!(!cidr("192.0.2.7").contains(ip("192.0.2.8")));
        assert!(cidr("2001:db8::/32").contains(ip("2001:db8:1::1")));
        assert!(!cidr("2001:db8::/32").contains(ip("2001:db9::1")));
        assert!(cidr("10.0.0.0/8").contains(ip("::ffff:10.1.2.3")));
        assert!(!cidr("10.0.0.0/8").contains(ip("2001:db8::1")));
        for bad in ["10.0.0.0/33", "::/129", "nonsense", "10.0.0.0/x"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
