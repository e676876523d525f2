"""The harness's topology as processes on this machine, shared by the suite: the stand-in
provider (tests/support/standin.py, scripted per test), two gateways (`sandbase server`,
one database, one Redis prefix, a vault key) and one worker with the base template. A test
makes its own team; either gateway may be called, killed and started again."""

import base64
import http.client
import json
import os
import shutil
import signal
import subprocess
import tempfile
import socket
import sys
import time
import urllib.parse
import uuid

import pytest

from tests.support.api import call, new_key
from tests.support.gateways import (
    BINARY, drop_database, free_port, fresh_database, gateway_env, internal_tls, proxy_ports,
    start_worker, wait_for_base, wait_ready)
from tests.support.standin import ANTHROPIC_SECRET, OPENAI_SECRET, StandIn

NODE_TOKEN = "harness-node-token-" + "x" * 32
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
id = "openai/gpt-tiny"
provider = "oa"
upstream = "gpt-tiny"
context_window = 3000
max_output = 100
input = "1"
output = "1"

[[store.mcp_servers]]
name = "upstream"
url = "http://127.0.0.1:{mcp_port}/mcp"
credential_file = "{mcp_secret}"
price_per_call = "0.01"
timeout_secs = 10
"""
MODELS = ["openai/gpt-test", "anthropic/claude-test"]


def wait_for_port(port, deadline=30):
    end = time.time() + deadline
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.time() < end, f"nothing listens on {port}"
            time.sleep(0.1)


class Cluster:
    def __init__(self, workdir, database_url):
        self.workdir = workdir
        self.database_url = database_url
        self.standin = StandIn.spawn()
        write = lambda name, text: open(os.path.join(workdir, name), "w").write(text) and None
        # An operator's MCP server (tests/mcp/upstream.py), counting its calls in a file.
        self.mcp_port, self.mcp_calls = free_port(), os.path.join(workdir, "mcp-calls")
        write("mcp-calls", "")
        write("mcp.secret", "upstream-mcp-secret\n")
        upstream = os.path.join(os.path.dirname(os.path.dirname(__file__)), "mcp", "upstream.py")
        self.mcp = subprocess.Popen(
            [sys.executable, upstream, str(self.mcp_port), self.mcp_calls],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "mcp.log"), "w"))
        write("openai.key", OPENAI_SECRET + "\n")
        write("anthropic.key", ANTHROPIC_SECRET + "\n")
        write("vault.keys", f"1:{base64.b64encode(os.urandom(32)).decode()}\n")
        self.config = os.path.join(workdir, "sandbase.toml")
        write("sandbase.toml", CONFIG.format(
            upstream=self.standin.url, openai_file=os.path.join(workdir, "openai.key"),
            anthropic_file=os.path.join(workdir, "anthropic.key"), mcp_port=self.mcp_port,
            mcp_secret=os.path.join(workdir, "mcp.secret")))
        # The internal channel over TLS: a sandbox with store access needs it.
        tls_settings, self.tls_args = internal_tls(workdir)
        self.env = gateway_env(database_url, "harness", workdir, **tls_settings,
                               WORKERS__NODE_TOKEN=NODE_TOKEN,
                               VAULT__KEY_FILE=os.path.join(workdir, "vault.keys"),
                               SANDBOXES__DEFAULT_TEMPLATE="base",
                               HARNESS__LEASE_SECS="3",
                               # Runtime priced high: a run's 0.05 credits last seconds.
                               BILLING__VCPU_SECOND_MICRO="2000",
                               # A sandbox nobody keeps alive lives 5 s: a run's lives as
                               # long as the run.
                               SANDBOXES__DEFAULT_TIMEOUT_SECS="5",
                               WORKERS__HEARTBEAT_TTL_SECS="30",
                               WORKERS__LOST_AFTER_SECS="60",
                               RATE_LIMIT__PER_SECOND="10000", RATE_LIMIT__BURST="10000",
                               RATE_LIMIT__TEAM_PER_SECOND="100000",
                               RATE_LIMIT__TEAM_BURST="100000",
                               SERVER__REQUESTS_PER_IP_PER_SECOND="100000",
                               SERVER__REQUESTS_PER_IP_BURST="100000")
        self.ports = [(free_port(), free_port()) for _ in range(2)]
        self.gateways = [None, None]
        self.urls = [f"http://127.0.0.1:{public}" for public, _ in self.ports]
        self.worker = None

    def start(self):
        """Migrates, starts both gateways and the worker, and waits for the base template."""
        subprocess.run([BINARY, "migrate"], env=self.env, check=True, capture_output=True)
        wait_for_port(self.mcp_port)
        self.start_gateway(0)
        self.start_gateway(1)
        # Egress (a pool of its own, a proxy): the store is reached from inside through it.
        egress = ["--egress-pool", "10.215.0.0", "--egress-proxy-port", str(proxy_ports())]
        self.worker, _ = start_worker(f"https://127.0.0.1:{self.ports[0][1]}",
                                      uuid.uuid4().hex, self.workdir, NODE_TOKEN, "harness",
                                      egress, self.tls_args)
        wait_for_base(self.urls[0], new_key(self.urls[0], "Harness"), self.worker, self.workdir)

    def start_gateway(self, index, **settings):
        """Gateway `index` (started again after a kill); `settings` are SANDBASE_* variables
        of this start only (`HARNESS__MAX_CONCURRENT="0"`: it steps no run)."""
        public, internal = self.ports[index]
        log = os.path.join(self.workdir, f"gateway-{index}.log")
        env = {**self.env, "SANDBASE_SERVER__INTERNAL_LISTEN": f"127.0.0.1:{internal}",
               **{f"SANDBASE_{name}": value for name, value in settings.items()}}
        process = subprocess.Popen(
            [BINARY, "server", "--listen", f"127.0.0.1:{public}", "--config", self.config],
            env=env, stdout=subprocess.DEVNULL, stderr=open(log, "a"))
        self.gateways[index] = process
        wait_ready(self.urls[index], process, log)

    def signal_gateway(self, index, how):
        self.gateways[index].send_signal(how)
        if how in (signal.SIGKILL, signal.SIGTERM):
            self.gateways[index].wait(timeout=60)

    def restart_gateway(self, index, **settings):
        if self.gateways[index].poll() is None:
            self.signal_gateway(index, signal.SIGTERM)
        self.start_gateway(index, **settings)

    def log(self, name):
        return open(os.path.join(self.workdir, name)).read()

    def close(self):
        for process in [self.worker, *self.gateways, self.mcp]:
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=60)
        self.standin.close()


@pytest.fixture(scope="session")
def cluster():
    workdir = tempfile.mkdtemp(prefix="sandbase-harness-")
    database, database_url = fresh_database("sandbase_test_harness")
    cluster = Cluster(workdir, database_url)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        drop_database(database)
        shutil.rmtree(workdir, ignore_errors=True)


class Team:
    """A new team (10 starter credits) and its key, on either gateway."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.token = new_key(cluster.urls[0], "Harness")

    def call(self, method, path, body=None, gateway=0, token=None):
        return call(self.cluster.urls[gateway], method, path, token or self.token, body)

    def run(self, model, script, steps, tools=("shell", "files", "python"), **fields):
        """Registers `steps` as the stand-in's script `script` and starts a run of `model`
        whose input plays it."""
        self.cluster.standin.script(script, steps)
        body = {"model": model, "input": f"[[script:{script}]] go",
                "tools": [{"type": name} if isinstance(name, str) else name for name in tools],
                **fields}
        return self.call("POST", "/v1/agent-runs", body)

    def wait(self, run_id, statuses=("idle", "completed", "failed", "cancelled", "limited",
                                     "requires_action"), deadline=120, gateway=0):
        end = time.time() + deadline
        while True:
            run = self.call("GET", f"/v1/agent-runs/{run_id}", gateway=gateway)
            if run["status"] in statuses:
                return run
            assert time.time() < end, f"the run stayed {run['status']}: {run}"
            time.sleep(0.1)

    def events(self, run_id, after=0, gateway=0):
        page = self.call("GET", f"/v1/agent-runs/{run_id}/events?after={after}&limit=1000",
                         gateway=gateway)
        return page["events"]

    def exec(self, sandbox_id, command):
        """A command in a run's sandbox, resumed first (a waiting run's sandbox is paused)."""
        sandbox = self.call("GET", f"/v1/sandboxes/{sandbox_id}")
        if sandbox["state"] == "paused":
            self.call("POST", f"/v1/sandboxes/{sandbox_id}/resume", {})
        return self.call("POST", f"/v1/sandboxes/{sandbox_id}/exec", {"command": command})


@pytest.fixture
def team(cluster):
    """A new team; its runs that still wait are cancelled after the test, so that the
    sandboxes they keep paused give the worker's room back."""
    team = Team(cluster)
    yield team
    try:
        runs = team.call("GET", "/v1/agent-runs")["agent_runs"]
    except Exception:
        return
    for run in runs:
        if run["status"] not in ("completed", "failed", "cancelled", "limited"):
            try:
                team.call("POST", f"/v1/agent-runs/{run['id']}/cancel", {"scope": "run"})
            except Exception:
                pass


class Sse:
    """A Server-Sent Events stream of a run's events, read frame by frame (the raw bytes of
    each kept)."""

    def __init__(self, url, token, run_id, last_event_id=None):
        parsed = urllib.parse.urlparse(url)
        self.connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
        headers = {"authorization": f"Bearer {token}", "accept": "text/event-stream"}
        if last_event_id is not None:
            headers["last-event-id"] = str(last_event_id)
        self.connection.request("GET", f"/v1/agent-runs/{run_id}/events", headers=headers)
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.read()

    def frames(self):
        """(raw bytes, event) pairs until the stream ends or breaks."""
        raw = b""
        while True:
            try:
                line = self.response.readline()
            except (OSError, http.client.HTTPException):
                return
            if not line:
                return
            raw += line
            if line == b"\n":
                data = [l[6:] for l in raw.split(b"\n") if l.startswith(b"data: ")]
                yield raw, json.loads(data[0])
                raw = b""

    def close(self):
        self.connection.close()
