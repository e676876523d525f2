//! SandBase's nftables table: packets from sandbox links reach only the egress proxy's ports
//! on the host (TCP 80 and 443 redirected to its transparent listeners, UDP 53 to its DNS
//! responder) and are dropped otherwise, in input and forward.

use std::net::Ipv4Addr;

use anyhow::Context;

/// The nftables table SandBase owns.
pub const TABLE: &str = "sandbase";
/// Host-side links are named `sbh<slot>`; the sandbox side `sbs<slot>` before it moves.
pub(super) const HOST_PREFIX: &str = "sbh";

/// The whole table, replacing any earlier one, for a /16 egress pool and the proxy's port
/// (`+ 1` plain HTTP, `+ 2` TLS, `+ 3` DNS).
pub fn ruleset(pool: Ipv4Addr, proxy_port: u16) -> String {
    let pool = format!("{pool}/16");
    let (port, http_port, tls_port, dns_port) =
        (proxy_port, proxy_port + 1, proxy_port + 2, proxy_port + 3);
    // Redirected connections arrive at the host-side address of the sandbox's link, on
    // the transparent ports: the input chain sees those.
    format!(
        "table inet {TABLE}\n\
         delete table inet {TABLE}\n\
         table inet {TABLE} {{\n\
           chain prerouting {{\n\
             type nat hook prerouting priority dstnat; policy accept;\n\
             iifname \"{HOST_PREFIX}*\" tcp dport 80 redirect to :{http_port}\n\
             iifname \"{HOST_PREFIX}*\" tcp dport 443 redirect to :{tls_port}\n\
             iifname \"{HOST_PREFIX}*\" udp dport 53 redirect to :{dns_port}\n\
           }}\n\
           chain input {{\n\
             type filter hook input priority -10; policy accept;\n\
             iifname \"{HOST_PREFIX}*\" ip daddr {pool} tcp dport {{ {port}, {http_port}, {tls_port} }} ct state new,established accept\n\
             iifname \"{HOST_PREFIX}*\" ip daddr {pool} udp dport {dns_port} accept\n\
             iifname \"{HOST_PREFIX}*\" ct state established,related accept\n\
             iifname \"{HOST_PREFIX}*\" counter drop\n\
           }}\n\
           chain forward {{\n\
             type filter hook forward priority -10; policy accept;\n\
             iifname \"{HOST_PREFIX}*\" counter drop\n\
             oifname \"{HOST_PREFIX}*\" counter drop\n\
           }}\n\
         }}\n"
    )
}

/// Loads a ruleset with `nft -f -`.
pub async fn install(ruleset: &str) -> anyhow::Result<()> {
    let mut child = tokio::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running nft (is nftables installed?)")?;
    if let Some(mut stdin) = child.stdin.take() {
        tokio::io::AsyncWriteExt::write_all(&mut stdin, ruleset.as_bytes()).await?;
    }
    let output = child.wait_with_output().await?;
    anyhow::ensure!(
        output.status.success(),
        "installing the egress firewall: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_links_reach_only_the_proxy_and_everything_else_is_dropped() {
        let rules = ruleset(Ipv4Addr::new(10, 213, 0, 0), 3128);
        let lines: Vec<&str> = rules.lines().map(str::trim).collect();
        // The table is replaced whole: nothing of an earlier one stays.
        assert_eq!(
            &lines[..2],
            ["table inet sandbase", "delete table inet sandbase"]
        );
        for expected in [
            "iifname \"sbh*\" tcp dport 80 redirect to :3129",
            "iifname \"sbh*\" tcp dport 443 redirect to :3130",
            "iifname \"sbh*\" udp dport 53 redirect to :3131",
            "iifname \"sbh*\" ip daddr 10.213.0.0/16 tcp dport { 3128, 3129, 3130 } ct state new,established accept",
            "iifname \"sbh*\" ip daddr 10.213.0.0/16 udp dport 3131 accept",
        ] {
            assert!(lines.contains(&expected), "missing {expected}");
        }
        // Input from a link ends in a drop, and forwarding to or from a link is dropped.
        let input: Vec<&str> = rules
            .split("chain input")
            .nth(1)
            .unwrap()
            .split("chain forward")
            .next()
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|line| line.starts_with("iifname"))
            .collect();
        assert_eq!(input.last(), Some(&"iifname \"sbh*\" counter drop"));
        let forward = rules.split("chain forward").nth(1).unwrap();
        assert!(forward.contains("iifname \"sbh*\" counter drop"));
        assert!(forward.contains("oifname \"sbh*\" counter drop"));
        // No rule in forward accepts: a sandbox reaches no other host or sandbox directly.
        assert!(
            forward
                .lines()
                .map(str::trim)
                .filter(|line| line.starts_with("iifname") || line.starts_with("oifname"))
                .all(|line| !line.contains("accept"))
        );
    }
}
