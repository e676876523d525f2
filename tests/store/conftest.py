"""A real gateway (`sandbase server`, its own database and Redis prefix) whose store is
configured with the local stand-in providers, and a fresh team per test."""

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

import pytest

import standin

DATABASE_URL = os.environ.get(
    "SANDBASE_TEST_DATABASE_URL", "postgres://sandbase:sandbase@127.0.0.1:5432/sandbase"
)
REDIS_URL = os.environ.get("SANDBASE_TEST_REDIS_URL", "redis://127.0.0.1:6379")
BINARY = os.environ.get("SANDBASE_BINARY", "target/debug/sandbase")

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
credential_file = "{anthropic_file}"

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


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def psql(sql):
    subprocess.run(["psql", DATABASE_URL, "-qAt", "-c", sql], check=True,
                   capture_output=True)


class Gateway:
    def __init__(self, url, seen):
        self.url = url
        self.seen = seen

    def call(self, method, path, token, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}{path}", data=data, method=method,
            headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        )
        with urllib.request.urlopen(request) as answer:
            return json.loads(answer.read())

    def signup(self):
        body = {"email": f"sdk-{uuid.uuid4().hex}@example.com",
                "password": "a long enough password", "team_name": "SDK"}
        request = urllib.request.Request(
            f"{self.url}/v1/auth/signup", data=json.dumps(body).encode(), method="POST",
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request) as answer:
            return json.loads(answer.read())["api_key"]["token"]

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
    upstream, seen = standin.start()
    workdir = tempfile.mkdtemp(prefix="sandbase-sdk-")
    files = {}
    for name, secret in [("openai_file", standin.OPENAI_SECRET),
                         ("anthropic_file", standin.ANTHROPIC_SECRET)]:
        files[name] = os.path.join(workdir, name)
        with open(files[name], "w") as handle:
            handle.write(secret + "\n")
    config = os.path.join(workdir, "sandbase.toml")
    with open(config, "w") as handle:
        handle.write(CONFIG.format(upstream=upstream, **files))
    database = f"sandbase_test_sdk_{uuid.uuid4().hex}"
    psql(f'CREATE DATABASE "{database}"')
    base = DATABASE_URL.rsplit("/", 1)[0]
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DATABASE_URL": f"{base}/{database}",
        "REDIS_URL": REDIS_URL,
        "SANDBASE_REDIS__KEY_PREFIX": f"sandbase-sdk-test:{uuid.uuid4().hex}:",
        "SANDBASE_AUTH__JWT_SECRET": uuid.uuid4().hex + uuid.uuid4().hex,
        "SANDBASE_AUTH__SIGNUPS_PER_HOUR": "1000000",
        "SANDBASE_SERVER__INTERNAL_LISTEN": f"127.0.0.1:{free_port()}",
        "SANDBASE_RUNS__ARTIFACTS_DIR": os.path.join(workdir, "artifacts"),
    }
    # The log goes to a file: a pipe nobody reads fills up, and the gateway blocks on it.
    log = os.path.join(workdir, "gateway.log")
    process = subprocess.Popen(
        [BINARY, "server", "--config", config, "--listen", f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz") as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.time() > deadline:
            raise RuntimeError(open(log).read()[-4000:])
        time.sleep(0.1)
    yield Gateway(url, seen)
    process.terminate()
    process.wait(timeout=30)
    psql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.fixture
def key(gateway):
    """The SandBase key of a new team (10 starter credits)."""
    return gateway.signup()
