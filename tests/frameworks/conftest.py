"""A real gateway (`sandbase server`) with a store whose one model is played by the shared
stand-in (tests/support/standin.py), and a real worker with the `base` template, for the
agent frameworks' adapters (each framework's test runs in its own virtualenv,
.venv-frameworks/NAME, made by `scripts/setup --test`)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from tests.support.api import call, new_key
from tests.support.standin import OPENAI_SECRET, StandIn, store_config
from tests.support.gateways import (
    drop_database, free_port, fresh_database, gateway_env, start_gateway, start_worker,
    wait_for_base,
)

NODE_TOKEN = "frameworks-test-node-token-0123456789"
MODEL = "openai/gpt-test"


class Cluster:
    def __init__(self, url, standin):
        self.url = url
        self.standin = standin

    def key(self):
        """A new team's key, with starter credits."""
        return new_key(self.url, "Frameworks")

    def killed_leaves_nothing(self, key, script, expiry=10):
        """Runs `script` (Python, printing `SANDBOX <id>` once it made a sandbox that expires
        after `expiry` seconds) in a process of its own, kills it, and asserts the sandbox
        was running and is gone once its expiry passed."""
        process = subprocess.Popen([sys.executable, "-c", script, str(expiry)], stdout=subprocess.PIPE,
                                   text=True, env=dict(os.environ))
        # A framework may log to stdout too: the line that names the sandbox.
        line = next((line for line in process.stdout if line.startswith("SANDBOX ")), "")
        sandbox_id = line.split()[-1] if line else ""
        assert sandbox_id, "the child made no sandbox"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        assert [sandbox["id"] for sandbox in self.sandboxes(key, "running")] == [sandbox_id]
        deadline = time.monotonic() + expiry + 50
        while self.sandboxes(key, "running") and time.monotonic() < deadline:
            time.sleep(1)
        assert self.sandboxes(key, "running") == [], "the sandbox outlived its expiry"

    def sandboxes(self, key, state=None):
        """The team's sandboxes (all states, or those in `state`)."""
        query = f"?state={state}" if state else ""
        return call(self.url, "GET", f"/v1/sandboxes{query}", key)["sandboxes"]


@pytest.fixture(scope="session")
def cluster():
    workdir = tempfile.mkdtemp(prefix="sandbase-frameworks-")
    standin = StandIn.spawn()
    with open(os.path.join(workdir, "openai.key"), "w") as key:
        key.write(OPENAI_SECRET + "\n")
    config = os.path.join(workdir, "sandbase.toml")
    with open(config, "w") as settings:
        settings.write(store_config(standin.url, os.path.join(workdir, "openai.key"), MODEL))
    database, database_url = fresh_database("sandbase_test_frameworks")
    internal = f"127.0.0.1:{free_port()}"
    env = gateway_env(database_url, "frameworks", workdir, WORKERS__NODE_TOKEN=NODE_TOKEN,
                      SANDBOXES__DEFAULT_TEMPLATE="base", SERVER__INTERNAL_LISTEN=internal)
    gateway, url = start_gateway(env, free_port(), os.path.join(workdir, "gateway.log"), config)
    worker, _ = start_worker(f"http://{internal}", uuid.uuid4().hex, workdir, NODE_TOKEN,
                             "frameworks")
    try:
        wait_for_base(url, new_key(url, "Probe"), worker, workdir)
        yield Cluster(url, standin)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        gateway.terminate()
        gateway.wait(timeout=30)
        drop_database(database)
        standin.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def sandbase_env(cluster, monkeypatch):
    """A new team's key in the SDK's environment variables: what the adapters read."""
    key = cluster.key()
    monkeypatch.setenv("SANDBASE_API_KEY", key)
    monkeypatch.setenv("SANDBASE_URL", cluster.url)
    return key
