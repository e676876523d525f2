"""Two real gateways (`sandbase server`, one database, one Redis prefix) and a real worker
(`sandbase worker` on SandBase's containerd, its own namespace, the `base` template), for
the MCP tests. The second gateway gives new teams no starter credits."""

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from tests.support.api import new_key
from tests.support.gateways import (
    SOCKET, drop_database, free_port, fresh_database, gateway_env, start_gateway,
    start_worker, wait_for_base,
)
NODE_TOKEN = "mcp-test-node-token-0123456789"

# The operator's MCP server: 0.05 credits a call, 2 s at most.
MCP_SERVERS = """
[store]
[[store.mcp_servers]]
name = "upstream"
url = "http://127.0.0.1:{port}/mcp"
credential_file = "{secret}"
price_per_call = "0.05"
timeout_secs = 2
"""


def wait_for_port(port):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


class Cluster:
    def __init__(self, urls, namespace):
        self.urls = urls
        self.namespace = namespace

    def signup(self, gateway=0):
        return new_key(self.urls[gateway], "MCP")

    def containers(self):
        listed = subprocess.run(
            ["ctr", "--address", SOCKET, "-n", self.namespace, "containers", "ls", "-q"],
            capture_output=True, text=True, check=True)
        return listed.stdout.split()


@pytest.fixture(scope="session")
def cluster():
    workdir = tempfile.mkdtemp(prefix="sandbase-mcp-")
    database, database_url = fresh_database("sandbase_test_mcp")
    env = gateway_env(database_url, "mcp", workdir, WORKERS__NODE_TOKEN=NODE_TOKEN,
                      SANDBOXES__DEFAULT_TEMPLATE="base")
    # The operator's MCP server, and the first gateway's store offering it.
    upstream_port = free_port()
    counter = os.path.join(workdir, "upstream-calls")
    open(counter, "w").close()
    upstream = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "upstream.py"),
         str(upstream_port), counter],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "upstream.log"), "w"))
    wait_for_port(upstream_port)
    secret = os.path.join(workdir, "upstream-secret")
    with open(secret, "w") as handle:
        handle.write("upstream-mcp-secret\n")
    offering = os.path.join(workdir, "offering.toml")
    with open(offering, "w") as handle:
        handle.write(MCP_SERVERS.format(port=upstream_port, secret=secret))
    internal = f"127.0.0.1:{free_port()}"
    first, url = start_gateway({**env, "SANDBASE_SERVER__INTERNAL_LISTEN": internal}, free_port(),
                               os.path.join(workdir, "gateway-1.log"), offering)
    broke = os.path.join(workdir, "broke.toml")
    with open(broke, "w") as handle:
        handle.write('[billing]\nstarter_credits = "0"\n')
    second, url2 = start_gateway(
        {**env, "SANDBASE_SERVER__INTERNAL_LISTEN": f"127.0.0.1:{free_port()}"},
        free_port(), os.path.join(workdir, "gateway-2.log"), broke)
    unique = uuid.uuid4().hex
    worker, namespace = start_worker(f"http://{internal}", unique, workdir, NODE_TOKEN, "mcp")
    cluster = Cluster([url, url2], namespace)
    cluster.upstream_calls = counter
    cluster.gateway_pids = [first.pid, second.pid]
    probe = cluster.signup()
    wait_for_base(url, probe, worker, workdir)
    yield cluster
    worker.terminate()
    worker.wait(timeout=60)
    for process in (first, second, upstream):
        process.terminate()
        process.wait(timeout=30)
    drop_database(database)
