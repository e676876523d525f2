//! Test support (feature `testing`): an HTTP (port 80) and HTTPS (port 443, a certificate for
//! `*.test.example` from a CA of its own) upstream in a network namespace of its own, joined
//! to the host by a veth pair on a documentation address (203.0.113.0/24), so tests reach a
//! real server without weakening the SSRF guard. It speaks HTTP/1.1 (keep-alive) and answers
//! with the request line and headers (an `Authorization` value shown only as `<redacted>`), a
//! POST with its body's length; paths under `/echo` and `/redirect` behave as careless APIs
//! do and echo everything back (the whole request, headers, a POSTed body, base64-encoded
//! (`/echo-b64`), gzip-compressed (`/echo-gzip`), chunked (`/echo-chunked`), the query in a
//! redirect's `Location`, and TRACE); `GET /upgrade` with `Upgrade: echo` by switching protocols
//! and echoing what it then receives (`/upgrade-greet` first writes the whole request into the
//! upgraded stream), and logs every request in full (bodies too) to a file
//! the test reads. Needs root, iproute2 and python3.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a failed step is a failed test

use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const UPSTREAM: &str = r#"
import base64, gzip, http.server, ssl, sys, threading
log = open(sys.argv[2], "a")
lock = threading.Lock()
class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        with lock:
            log.write(self.requestline + "\n" + str(self.headers))
            log.flush()
        if self.path.split("?")[0] in ("/upgrade", "/upgrade-greet") and self.headers.get("Upgrade") == "echo":
            self.send_response(101)
            self.send_header("Upgrade", "echo")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            if self.path.startswith("/upgrade-greet"):
                # A careless server greets the upgraded stream with the request it got.
                self.wfile.write((self.requestline + "\n" + str(self.headers) + "END-GREETING\n").encode())
                self.wfile.flush()
            while True:
                data = self.rfile.read1(65536)
                if not data:
                    break
                self.wfile.write(data)
            self.close_connection = True
            return
        if self.path.startswith("/echo") or self.path.startswith("/redirect"):
            return self.echo_everything()
        shown = "".join(
            "%s: %s\n" % (k, "<redacted>" if k.lower() == "authorization" else v)
            for k, v in self.headers.items())
        body = (self.requestline + "\n" + shown + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def echo_everything(self):
        # What careless APIs do: quote the request, credentials and all, back to the caller.
        text = (self.requestline + "\n" + str(self.headers)).encode()
        with lock:
            log.write(self.requestline + "\n" + str(self.headers))
            log.flush()
        query = self.path.split("?", 1)[1] if "?" in self.path else ""
        headers = {"X-Echo-Authorization": self.headers.get("Authorization", "")}
        if self.path.startswith("/redirect"):
            status, headers["Location"] = 302, "/login?" + query
        elif self.path.startswith("/echo-b64"):
            status, text = 200, base64.b64encode(b"stored: " + text)
        elif self.path.startswith("/echo-gzip"):
            status, text = 200, gzip.compress(text)
            headers["Content-Encoding"] = "gzip"
        elif self.path.startswith("/echo-chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(text), 7):
                piece = text[i:i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        else:
            status = 200
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)
    def do_TRACE(self):
        self.echo_everything()
    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
        else:
            data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with lock:
            log.write(self.requestline + "\n" + str(self.headers) + data.decode("utf-8", "replace") + "\n")
            log.flush()
        if self.path.startswith("/echo"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        body = ("%s\nbody: %d bytes\n" % (self.requestline, len(data))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
plain = http.server.ThreadingHTTPServer((sys.argv[1], 80), Echo)
tls = http.server.ThreadingHTTPServer((sys.argv[1], 443), Echo)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[3], sys.argv[4])
tls.socket = context.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
plain.serve_forever()
"#;

/// A namespace with an HTTP echo server on port 80 at `address`.
pub struct Upstream {
    slot: u8,
    namespace: String,
    host_link: String,
    pub address: Ipv4Addr,
    server: Child,
    directory: std::path::PathBuf,
    /// The CA its HTTPS certificate is from (PEM).
    pub ca_pem: String,
}

/// A CA and a certificate for `*.test.example` it signed: (CA PEM, chain PEM, key PEM).
fn certificates() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Test upstream CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["*.test.example".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (
        ca.pem(),
        format!("{}{}", leaf.pem(), ca.pem()),
        key.serialize_pem(),
    )
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
        let slot = claim_slot(u32::from_str_radix(tag, 16).unwrap());
        let (host, peer) = (
            Ipv4Addr::new(203, 0, 113, slot * 4 + 1),
            Ipv4Addr::new(203, 0, 113, slot * 4 + 2),
        );
        let namespace = format!("sbx-egress-{tag}");
        let host_link = format!("veg{tag}");
        let peer_link = format!("vep{tag}");
        // A crashed run's namespace of the same name goes first.
        let _ = Command::new("ip")
            .args(["netns", "del", &namespace])
            .output();
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
        let directory = std::env::temp_dir().join(&namespace);
        std::fs::create_dir_all(&directory).unwrap();
        let (ca_pem, chain, key) = certificates();
        std::fs::write(directory.join("chain.pem"), chain).unwrap();
        std::fs::write(directory.join("key.pem"), key).unwrap();
        std::fs::write(directory.join("requests.log"), "").unwrap();
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
            .arg(directory.join("requests.log"))
            .arg(directory.join("chain.pem"))
            .arg(directory.join("key.pem"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Upstream {
            slot,
            namespace,
            host_link,
            address: peer,
            server,
            directory,
            ca_pem,
        }
    }

    /// Every request it received, in full (request line and headers).
    pub fn requests(&self) -> String {
        std::fs::read_to_string(self.directory.join("requests.log")).unwrap()
    }

    pub async fn wait_ready(&self) {
        for _ in 0..100 {
            if tokio::net::TcpStream::connect((self.address, 80))
                .await
                .is_ok()
                && tokio::net::TcpStream::connect((self.address, 443))
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
        taken_slots().remove(&self.slot);
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .output();
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

fn taken_slots() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<u8>> {
    static TAKEN: std::sync::Mutex<std::collections::BTreeSet<u8>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    TAKEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A /30 of 203.0.113.0/24 that no other upstream of this process holds and no interface of
/// the host has (a crashed run's leftovers), starting the search at `seed`.
fn claim_slot(seed: u32) -> u8 {
    let listed = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default();
    let mut taken = taken_slots();
    for offset in 0..60 {
        let slot = ((seed + offset) % 60) as u8;
        let host = format!(" {}/30 ", Ipv4Addr::new(203, 0, 113, slot * 4 + 1));
        if !taken.contains(&slot) && !listed.contains(&host) {
            taken.insert(slot);
            return slot;
        }
    }
    panic!("every upstream slot of 203.0.113.0/24 is taken");
}

fn rand_u32() -> u32 {
    rand::random()
}
