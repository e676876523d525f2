"""Two real gateways on one database (`sandbase server`) and a real worker with the `base`
template, for the Python SDK's scenarios. The second gateway gives new teams no starter
credits and each key one request a second, for the SDK's 402 and 429 handling. The worker
has an egress network: `api.test.example` and `other.test.example` lead to an upstream in a
network namespace of the suite's own (tests/support/upstream.py); `loopback.test.example` is pinned to
the node's loopback, which the SSRF guard must refuse however the name was resolved."""

import base64
import os
import tempfile
import uuid

import pytest

from tests.support.api import new_key
from tests.support.gateways import (
    drop_database, egress_args, free_port, fresh_database, gateway_env, internal_tls,
    start_gateway, start_worker, wait_for_base,
)
from tests.support.upstream import Upstream

NODE_TOKEN = "sdk-test-node-token-0123456789"


UPSTREAM_NAMES = ("api.test.example", "other.test.example")


class Cluster:
    def __init__(self, url, strict_url, upstream):
        self.url = url
        self.strict_url = strict_url
        self.upstream = upstream

    def key(self):
        """A new team's key, with starter credits."""
        return new_key(self.url, "SDK")

    def strict_key(self):
        """A new team's key from the strict gateway: no credits, one request a second."""
        return new_key(self.strict_url, "SDK")


@pytest.fixture(scope="session")
def cluster():
    with Upstream(uuid.uuid4().hex) as upstream:
        yield from run_cluster(upstream)


def run_cluster(upstream):
    workdir = tempfile.mkdtemp(prefix="sandbase-sdk-")
    database, database_url = fresh_database("sandbase_test_sdk")
    # Credentials travel to workers only over the internal channel's TLS.
    tls_settings, tls_args = internal_tls(workdir)
    env = gateway_env(database_url, "sdk", workdir, WORKERS__NODE_TOKEN=NODE_TOKEN,
                      SANDBOXES__DEFAULT_TEMPLATE="base", **tls_settings)
    keys = os.path.join(workdir, "vault.keys")
    with open(keys, "w") as handle:
        handle.write(f"1:{base64.b64encode(os.urandom(32)).decode()}\n")
    env["SANDBASE_VAULT__KEY_FILE"] = keys
    internal = f"127.0.0.1:{free_port()}"
    first, url = start_gateway({**env, "SANDBASE_SERVER__INTERNAL_LISTEN": internal}, free_port(),
                               os.path.join(workdir, "gateway-1.log"))
    strict = os.path.join(workdir, "strict.toml")
    with open(strict, "w") as handle:
        handle.write('[billing]\nstarter_credits = "0"\n[rate_limit]\nper_second = 1\nburst = 1\n')
    second, strict_url = start_gateway(
        {**env, "SANDBASE_SERVER__INTERNAL_LISTEN": f"127.0.0.1:{free_port()}"},
        free_port(), os.path.join(workdir, "gateway-2.log"), strict)
    worker, _ = start_worker(f"https://{internal}", uuid.uuid4().hex, workdir, NODE_TOKEN, "sdk",
                             egress_args(upstream, UPSTREAM_NAMES,
                                         ["loopback.test.example=127.0.0.1"]), tls_args)
    wait_for_base(url, new_key(url, "SDK"), worker, workdir)
    yield Cluster(url, strict_url, upstream)
    worker.terminate()
    worker.wait(timeout=60)
    for process in (first, second):
        process.terminate()
        process.wait(timeout=30)
    drop_database(database)
