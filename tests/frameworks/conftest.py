"""A real gateway (`sandbase server`) and a real worker with the `base` template, for the
agent frameworks' adapters (each framework's test runs in its own virtualenv,
.venv-frameworks/NAME, made by `scripts/setup --test`)."""

import os
import shutil
import tempfile
import uuid

import pytest

from tests.support.api import call, new_key
from tests.support.gateways import (
    drop_database, free_port, fresh_database, gateway_env, start_gateway, start_worker,
    wait_for_base,
)

NODE_TOKEN = "frameworks-test-node-token-0123456789"


class Cluster:
    def __init__(self, url):
        self.url = url

    def key(self):
        """A new team's key, with starter credits."""
        return new_key(self.url, "Frameworks")

    def sandboxes(self, key, state=None):
        """The team's sandboxes (all states, or those in `state`)."""
        query = f"?state={state}" if state else ""
        return call(self.url, "GET", f"/v1/sandboxes{query}", key)["sandboxes"]


@pytest.fixture(scope="session")
def cluster():
    workdir = tempfile.mkdtemp(prefix="sandbase-frameworks-")
    database, database_url = fresh_database("sandbase_test_frameworks")
    internal = f"127.0.0.1:{free_port()}"
    env = gateway_env(database_url, "frameworks", workdir, WORKERS__NODE_TOKEN=NODE_TOKEN,
                      SANDBOXES__DEFAULT_TEMPLATE="base", SERVER__INTERNAL_LISTEN=internal)
    gateway, url = start_gateway(env, free_port(), os.path.join(workdir, "gateway.log"))
    worker, _ = start_worker(f"http://{internal}", uuid.uuid4().hex, workdir, NODE_TOKEN,
                             "frameworks")
    try:
        wait_for_base(url, new_key(url, "Probe"), worker, workdir)
        yield Cluster(url)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        gateway.terminate()
        gateway.wait(timeout=30)
        drop_database(database)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def sandbase_env(cluster, monkeypatch):
    """A new team's key in the SDK's environment variables: what the adapters read."""
    key = cluster.key()
    monkeypatch.setenv("SANDBASE_API_KEY", key)
    monkeypatch.setenv("SANDBASE_URL", cluster.url)
    return key
