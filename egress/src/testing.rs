//! Test support (feature `testing`): an HTTP upstream in a network namespace of its own,
//! joined to the host by a veth pair on a documentation address (203.0.113.0/24), so tests
//! reach a real server without weakening the SSRF guard. Needs root and iproute2.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a failed step is a failed test

use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const UPSTREAM: &str = r#"
import http.server, sys
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.requestline + "\n" + str(self.headers)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer((sys.argv[1], 80), Echo).serve_forever()
"#;

/// A namespace with an HTTP echo server on port 80 at `address`.
pub struct Upstream {
    namespace: String,
    host_link: String,
    pub address: Ipv4Addr,
    server: Child,
}

fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        output.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Upstream {
    pub fn start() -> Upstream {
        let tag = &format!("{:08x}", rand_u32())[..6];
        let slot = (u32::from_str_radix(tag, 16).unwrap() % 60) as u8;
        let (host, peer) = (
            Ipv4Addr::new(203, 0, 113, slot * 4 + 1),
            Ipv4Addr::new(203, 0, 113, slot * 4 + 2),
        );
        let namespace = format!("sbx-egress-{tag}");
        let host_link = format!("veg{tag}");
        let peer_link = format!("vep{tag}");
        ip(&["netns", "add", &namespace]);
        ip(&[
            "link", "add", &host_link, "type", "veth", "peer", "name", &peer_link,
        ]);
        ip(&["link", "set", &peer_link, "netns", &namespace]);
        ip(&["addr", "add", &format!("{host}/30"), "dev", &host_link]);
        ip(&["link", "set", &host_link, "up"]);
        ip(&[
            "-n",
            &namespace,
            "addr",
            "add",
            &format!("{peer}/30"),
            "dev",
            &peer_link,
        ]);
        ip(&["-n", &namespace, "link", "set", &peer_link, "up"]);
        ip(&["-n", &namespace, "link", "set", "lo", "up"]);
        let server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &namespace,
                "/usr/bin/python3",
                "-c",
                UPSTREAM,
            ])
            .arg(peer.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Upstream {
            namespace,
            host_link,
            address: peer,
            server,
        }
    }

    pub async fn wait_ready(&self) {
        for _ in 0..100 {
            if tokio::net::TcpStream::connect((self.address, 80))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the upstream did not start");
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .output();
    }
}

fn rand_u32() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    nanos ^ std::process::id().rotate_left(16)
}
