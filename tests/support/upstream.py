"""An upstream for egress scenarios, in a network namespace of its own (`Namespace`, where a
test may run a server of its own): HTTP on port 80 and HTTPS on 443 (a certificate for `*.test.example` from a CA made for the run), on a
documentation address (203.0.113.240/28, apart from the Rust suites' upstreams) joined to the
host by a veth pair, so a worker's egress proxy reaches a real server through the production
SSRF guard. A worker is pointed at it with `--egress-resolve NAME=ADDRESS` and trusts its CA
with `--egress-extra-ca`.

It answers `GET /whoami` with 200 `hello` only when the request carries
`Authorization: Bearer <token>` (the token the test gave it: the proof that the proxy injected
a credential), 401 otherwise; any other path with its request line. Every request is logged.

From Python: `with Upstream(token) as upstream: …`. From another language: run
`python3 -m tests.support.upstream` from the repository with the names to lead to it (the token in SANDBASE_UPSTREAM_TOKEN); it prints one JSON line
(`address`, `ca`, `log`, and `worker_args`: the worker's egress options for those names) once
serving, and tears everything down when its stdin closes. Needs root, iproute2, openssl and python3."""

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

from tests.support import certs

SERVER = r"""
import http.server, ssl, sys, threading
token, log = sys.argv[2], open(sys.argv[3], "a")
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        log.write(self.requestline + "\n")
        log.flush()
        if self.path == "/whoami":
            good = self.headers.get("Authorization") == "Bearer " + token
            status, body = (200, b"hello\n") if good else (401, b"who are you?\n")
        else:
            status, body = 200, (self.requestline + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
plain = http.server.ThreadingHTTPServer((sys.argv[1], 80), Handler)
tls = http.server.ThreadingHTTPServer((sys.argv[1], 443), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[4], sys.argv[5])
tls.socket = context.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
plain.serve_forever()
"""


class Namespace:
    """A network namespace joined to the host by a veth pair, its end at a documentation
    address of 203.0.113.240/28 (`address`), which the SSRF guard lets through: a real
    server a test starts in it (`popen`) is reached as a public one would be."""

    def __init__(self):
        self.tag = uuid.uuid4().hex[:6]
        self.namespace = f"sbx-up-{self.tag}"
        self.links = (f"vuh{self.tag}", f"vup{self.tag}")
        self.directory = tempfile.mkdtemp(prefix=f"sandbase-upstream-{self.tag}-")
        self.server = None

    def _slot(self):
        listed = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                                text=True).stdout
        for slot in range(60, 64):
            host = f"203.0.113.{slot * 4 + 1}"
            if f" {host}/30 " not in listed:
                return host, f"203.0.113.{slot * 4 + 2}"
        raise RuntimeError("every upstream slot of 203.0.113.240/28 is taken")

    def __enter__(self):
        host, self.address = self._slot()
        host_link, peer_link = self.links
        certs.run("ip", "netns", "add", self.namespace)
        certs.run("ip", "link", "add", host_link, "type", "veth", "peer", "name", peer_link)
        certs.run("ip", "link", "set", peer_link, "netns", self.namespace)
        certs.run("ip", "addr", "add", f"{host}/30", "dev", host_link)
        certs.run("ip", "link", "set", host_link, "up")
        certs.run("ip", "-n", self.namespace, "addr", "add", f"{self.address}/30", "dev", peer_link)
        certs.run("ip", "-n", self.namespace, "link", "set", peer_link, "up")
        certs.run("ip", "-n", self.namespace, "link", "set", "lo", "up")
        return self

    def popen(self, command, port, env=None):
        """Starts `command` in the namespace (its standard error in `server.err`) and waits
        until it listens on `port` of the namespace's address."""
        self.server = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, *command], env=env,
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.directory, "server.err"), "w"))
        deadline = time.time() + 30
        while subprocess.run(["ip", "netns", "exec", self.namespace, "python3", "-c",
                              f"import socket; socket.create_connection(('{self.address}', {port}), 1)"],
                             capture_output=True).returncode != 0:
            if self.server.poll() is not None or time.time() > deadline:
                raise RuntimeError(open(os.path.join(self.directory, "server.err")).read())
            time.sleep(0.1)
        return self.server

    def __exit__(self, *_):
        if self.server is not None:
            self.server.kill()
            self.server.wait()
        subprocess.run(["ip", "link", "del", self.links[0]], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True)


class Upstream(Namespace):
    def __init__(self, token):
        super().__init__()
        self.token = token
        self.log = os.path.join(self.directory, "requests.log")

    def __enter__(self):
        super().__enter__()
        try:
            self.ca, chain, key = certs.issue(self.directory, ["*.test.example"])
            open(self.log, "w").close()
            self.popen([sys.executable, "-c", SERVER, self.address, self.token, self.log, chain,
                        key], 443)
        except BaseException:
            self.__exit__()
            raise
        return self

    def requests(self):
        """The request lines the upstream has seen."""
        return open(self.log).read().splitlines()


if __name__ == "__main__":
    from tests.support.gateways import egress_args
    with Upstream(os.environ.get("SANDBASE_UPSTREAM_TOKEN", "")) as running:
        print(json.dumps({"address": running.address, "ca": running.ca, "log": running.log,
                          "worker_args": egress_args(running, sys.argv[1:])}), flush=True)
        sys.stdin.read()
