"""A real gateway (`sandbase server`, its own database and Redis prefix) whose store is
configured with the local stand-in providers, and a fresh team per test. The OpenAI key comes
from a file, the Anthropic key from the operator's vault (`sandbase vault secret set`)."""

import base64
import os
import subprocess
import tempfile
import time
import urllib.request

import pytest


from tests.support.api import call, new_key
from tests.support.gateways import (
    BINARY, drop_database, free_port, fresh_database, gateway_env, start_gateway)
from tests.support.standin import ANTHROPIC_SECRET, OPENAI_SECRET, StandIn

CONFIG = """
[store]
[[store.providers]]
name = "oa"
kind = "openai"
base_url = "{upstream}/v1"
credential_file = "{openai_file}"

[[store.providers]]
name = "an"
kind = "anthropic"
base_url = "{upstream}"
credential_secret = "anthropic-key"

[[store.models]]
id = "openai/gpt-test"
provider = "oa"
upstream = "gpt-test"
context_window = 100000
max_output = 1000
input = "2.50"
cached_input = "1.25"
output = "10"

[[store.models]]
id = "anthropic/claude-test"
provider = "an"
upstream = "claude-test"
context_window = 200000
max_output = 4096
input = "3"
cached_input = "0.30"
cache_write = "3.75"
output = "15"

[[store.models]]
id = "openai/gpt-dear"
provider = "oa"
upstream = "gpt-dear"
context_window = 100000
max_output = 100000
input = "1"
output = "1000"
"""


class Gateway:
    def __init__(self, url, provider):
        self.url = url
        self.provider = provider

    @property
    def seen(self):
        """What the provider received, oldest first: (headers, body) pairs."""
        return self.provider.seen

    def call(self, method, path, token, body=None):
        return call(self.url, method, path, token, body)

    def signup(self):
        return new_key(self.url, "SDK")

    def available(self, token):
        return self.call("GET", "/v1/billing/balance", token)["available_micro"]

    def store_request(self, token, request_id):
        """The store's record of a call, once settled (streams settle at their end)."""
        for _ in range(100):
            try:
                return self.call("GET", f"/v1/store/requests/{request_id}", token)
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise
            time.sleep(0.05)
        raise AssertionError(f"the call {request_id} was never settled")


@pytest.fixture(scope="session")
def gateway():
    provider = StandIn.spawn()
    upstream = provider.url
    workdir = tempfile.mkdtemp(prefix="sandbase-sdk-")
    openai_file = os.path.join(workdir, "openai_file")
    with open(openai_file, "w") as handle:
        handle.write(OPENAI_SECRET + "\n")
    config = os.path.join(workdir, "sandbase.toml")
    with open(config, "w") as handle:
        handle.write(CONFIG.format(upstream=upstream, openai_file=openai_file))
    database, database_url = fresh_database("sandbase_test_sdk")
    port = free_port()
    keys = os.path.join(workdir, "vault.keys")
    with open(keys, "w") as handle:
        handle.write(f"1:{base64.b64encode(os.urandom(32)).decode()}\n")
    env = gateway_env(database_url, "store", workdir, VAULT__KEY_FILE=keys,
                      SERVER__INTERNAL_LISTEN=f"127.0.0.1:{free_port()}")
    # The operator puts the Anthropic key into the vault, as an operator would.
    subprocess.run([BINARY, "migrate"], env=env, check=True, capture_output=True)
    stored = subprocess.run([BINARY, "vault", "secret", "set", "anthropic-key"], env=env,
                            input=ANTHROPIC_SECRET + "\n", text=True,
                            capture_output=True, check=True)
    assert "stored operator secret `anthropic-key`" in stored.stdout, stored
    listed = subprocess.run([BINARY, "vault", "secret", "ls"], env=env, text=True,
                            capture_output=True, check=True).stdout
    assert listed.startswith("anthropic-key\t") and ANTHROPIC_SECRET not in listed
    process, url = start_gateway(env, port, os.path.join(workdir, "gateway.log"), config)
    yield Gateway(url, provider)
    process.terminate()
    process.wait(timeout=30)
    provider.close()
    drop_database(database)


@pytest.fixture
def key(gateway):
    """The SandBase key of a new team (10 starter credits)."""
    return gateway.signup()
