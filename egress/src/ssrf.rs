//! The SSRF guard: which addresses a sandbox's traffic may be sent to. The proxy resolves a
//! name itself, checks every address here, and dials exactly the address it checked — so an
//! allowed name that resolves to an internal address (DNS rebinding included) is refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    Unspecified,
    Loopback,
    Private,
    LinkLocal,
    SharedAddressSpace,
    UniqueLocal,
    Multicast,
    Reserved,
    CloudMetadata,
    /// IPv4 embedded in IPv6 (mapped, compatible, 6to4, Teredo, NAT64): refused outright,
    /// so an IPv6 form cannot smuggle an internal IPv4 address.
    EmbeddedIpv4,
    /// One of the node's own addresses (or another configured one).
    Node,
    /// In a network the operator denies (the fleet's NAT and public addresses, …).
    Operator,
}

impl Blocked {
    pub fn as_str(self) -> &'static str {
        match self {
            Blocked::Unspecified => "unspecified address",
            Blocked::Loopback => "loopback address",
            Blocked::Private => "private address",
            Blocked::LinkLocal => "link-local address",
            Blocked::SharedAddressSpace => "carrier-grade NAT address",
            Blocked::UniqueLocal => "unique local IPv6 address",
            Blocked::Multicast => "multicast or broadcast address",
            Blocked::Reserved => "reserved address",
            Blocked::CloudMetadata => "cloud metadata address",
            Blocked::EmbeddedIpv4 => "IPv4 embedded in IPv6",
            Blocked::Node => "an address of this node",
            Blocked::Operator => "a network the operator denies",
        }
    }
}

fn in_v4(address: Ipv4Addr, network: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(address) & mask == u32::from(Ipv4Addr::from(network)) & mask
}

fn in_v6(address: Ipv6Addr, network: Ipv6Addr, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    u128::from(address) & mask == u128::from(network) & mask
}

fn check_v4(address: Ipv4Addr) -> Result<(), Blocked> {
    if address == Ipv4Addr::new(169, 254, 169, 254) || address == Ipv4Addr::new(100, 100, 100, 200)
    {
        return Err(Blocked::CloudMetadata);
    }
    let table: &[([u8; 4], u32, Blocked)] = &[
        ([0, 0, 0, 0], 8, Blocked::Unspecified),
        ([127, 0, 0, 0], 8, Blocked::Loopback),
        ([10, 0, 0, 0], 8, Blocked::Private),
        ([172, 16, 0, 0], 12, Blocked::Private),
        ([192, 168, 0, 0], 16, Blocked::Private),
        ([169, 254, 0, 0], 16, Blocked::LinkLocal),
        ([100, 64, 0, 0], 10, Blocked::SharedAddressSpace),
        ([192, 0, 0, 0], 24, Blocked::Reserved),
        ([198, 18, 0, 0], 15, Blocked::Reserved),
        ([224, 0, 0, 0], 4, Blocked::Multicast),
        ([240, 0, 0, 0], 4, Blocked::Reserved),
    ];
    for (network, prefix, reason) in table {
        if in_v4(address, *network, *prefix) {
            return Err(*reason);
        }
    }
    Ok(())
}

fn check_v6(address: Ipv6Addr) -> Result<(), Blocked> {
    if address.is_unspecified() {
        return Err(Blocked::Unspecified);
    }
    if address.is_loopback() {
        return Err(Blocked::Loopback);
    }
    let v6 = |text: &str| text.parse::<Ipv6Addr>().unwrap_or(Ipv6Addr::UNSPECIFIED);
    if address == v6("fd00:ec2::254") {
        return Err(Blocked::CloudMetadata);
    }
    let table: &[(&str, u32, Blocked)] = &[
        ("::ffff:0:0", 96, Blocked::EmbeddedIpv4),
        ("::", 96, Blocked::EmbeddedIpv4),
        ("64:ff9b::", 96, Blocked::EmbeddedIpv4),
        ("64:ff9b:1::", 48, Blocked::EmbeddedIpv4),
        ("2002::", 16, Blocked::EmbeddedIpv4),
        ("2001::", 32, Blocked::EmbeddedIpv4),
        ("100::", 64, Blocked::Reserved),
        ("fc00::", 7, Blocked::UniqueLocal),
        ("fe80::", 10, Blocked::LinkLocal),
        ("fec0::", 10, Blocked::Private),
        ("ff00::", 8, Blocked::Multicast),
    ];
    for (network, prefix, reason) in table {
        if in_v6(address, v6(network), *prefix) {
            return Err(*reason);
        }
    }
    Ok(())
}

/// Refuses internal, special and embedded-IPv4 addresses, and `node`'s own addresses.
pub fn check(address: IpAddr, node: &[IpAddr], denied: &[Cidr]) -> Result<(), Blocked> {
    match address {
        IpAddr::V4(v4) => check_v4(v4)?,
        IpAddr::V6(v6) => check_v6(v6)?,
    }
    if node.contains(&address) {
        return Err(Blocked::Node);
    }
    if denied.iter().any(|network| network.contains(address)) {
        return Err(Blocked::Operator);
    }
    Ok(())
}

/// A network (`198.51.100.0/24`, `2001:db8::/32`; a bare address is its own /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u32,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let bad = || format!("`{text}` is not an address or a network (address/prefix)");
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address.trim().parse().map_err(|_| bad())?;
        let longest = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(prefix) => prefix.trim().parse::<u32>().map_err(|_| bad())?,
            None => longest,
        };
        if prefix > longest {
            return Err(bad());
        }
        Ok(Cidr { network, prefix })
    }

    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, address) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                in_v4(address, network.octets(), self.prefix)
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => in_v6(address, network, self.prefix),
            _ => false,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Cidr, D::Error> {
        let text = String::deserialize(deserializer)?;
        Cidr::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(text: &str) -> Result<(), Blocked> {
        check(
            text.parse().unwrap(),
            &["203.0.113.99".parse().unwrap()],
            &[Cidr::parse("198.51.100.0/24").unwrap()],
        )
    }

    #[test]
    fn operator_networks_are_refused() {
        assert_eq!(verdict("198.51.100.200"), Err(Blocked::Operator));
        assert_eq!(verdict("198.51.101.1"), Ok(()));
        let v6 = Cidr::parse("2001:db8:1::/48").unwrap();
        assert!(v6.contains("2001:db8:1::5".parse().unwrap()));
        assert!(!v6.contains("2001:db8:2::5".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.0/33").is_err() && Cidr::parse("x/8").is_err());
        assert_eq!(
            Cidr::parse("192.0.2.7").unwrap().to_string(),
            "192.0.2.7/32"
        );
    }

    #[test]
    fn internal_and_special_addresses_are_refused() {
        let refused = [
            ("0.0.0.0", Blocked::Unspecified),
            ("127.0.0.1", Blocked::Loopback),
            ("127.1.2.3", Blocked::Loopback),
            ("10.1.2.3", Blocked::Private),
            ("172.31.255.255", Blocked::Private),
            ("192.168.1.1", Blocked::Private),
            ("169.254.169.254", Blocked::CloudMetadata),
            ("169.254.1.1", Blocked::LinkLocal),
            ("100.64.0.1", Blocked::SharedAddressSpace),
            ("100.127.255.254", Blocked::SharedAddressSpace),
            ("224.0.0.1", Blocked::Multicast),
            ("255.255.255.255", Blocked::Reserved),
            ("198.18.0.1", Blocked::Reserved),
            ("::", Blocked::Unspecified),
            ("::1", Blocked::Loopback),
            ("::ffff:127.0.0.1", Blocked::EmbeddedIpv4),
            ("::ffff:8.8.8.8", Blocked::EmbeddedIpv4),
            ("::127.0.0.1", Blocked::EmbeddedIpv4),
            ("64:ff9b::a9fe:a9fe", Blocked::EmbeddedIpv4),
            ("2002:7f00:1::", Blocked::EmbeddedIpv4),
            (
                "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                Blocked::EmbeddedIpv4,
            ),
            ("fd00:ec2::254", Blocked::CloudMetadata),
            ("fd12:3456::1", Blocked::UniqueLocal),
            ("fe80::1", Blocked::LinkLocal),
            ("ff02::1", Blocked::Multicast),
            ("203.0.113.99", Blocked::Node),
        ];
        for (address, reason) in refused {
            assert_eq!(verdict(address), Err(reason), "{address}");
        }
        for allowed in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "203.0.113.10",
        ] {
            assert_eq!(verdict(allowed), Ok(()), "{allowed}");
        }
    }
}
