"""SandBase's topology as processes on this machine: `sandbase migrate` once, two gateways
(`sandbase server`, one database, one Redis prefix) behind Debian's haproxy, three workers
registered through haproxy's internal frontend. The drills kill, stop and restart its parts
while clients keep calling, and check what the system promised."""

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid

import pytest

from tests.support import api
from tests.support.gateways import (
    BINARY, SOCKET, drop_database, free_port, fresh_database, gateway_env, wait_ready)
from tests.support.standin import OPENAI_SECRET, StandIn

NODE_TOKEN = "drill-node-token-" + "x" * 32
HAPROXY_CONFIG = """
global
    maxconn 4096
defaults
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    retries 3
    option redispatch
frontend public
    mode http
    option forwardfor
    bind 127.0.0.1:{public}
    default_backend gateways
backend gateways
    mode http
    balance roundrobin
    retry-on conn-failure empty-response
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 250ms fall 1 rise 2
{public_servers}
frontend internal
    mode tcp
    bind 127.0.0.1:{internal}
    default_backend internals
backend internals
    mode tcp
    balance roundrobin
    default-server inter 250ms fall 1 rise 2
{internal_servers}
"""

# The store, with the stand-in provider: one model whose calls cost about what they reserve
# (1 000 input tokens at 400 credits a million, 50 output tokens at 8 000), so that an
# admission that let more calls through than the credits cover would show as an overdraft.
STORE_CONFIG = """
[server]
trusted_proxies = ["127.0.0.1"]

[store]
[[store.providers]]
name = "oa"
kind = "openai"
base_url = "{upstream}/v1"
credential_file = "{credential}"

[[store.models]]
id = "openai/gpt-drill"
provider = "oa"
upstream = "gpt-drill"
context_window = 100000
max_output = 1000
input = "400"
cached_input = "400"
output = "8000"
"""


class Cluster:
    def __init__(self, workdir, database_url):
        self.workdir = workdir
        # A Redis of the cluster's own, which a drill may kill and start again.
        self.redis_port = free_port()
        self.redis = None
        self.start_redis()
        self.env = gateway_env(database_url, "drill", workdir,
                               WORKERS__NODE_TOKEN=NODE_TOKEN,
                               SANDBOXES__DEFAULT_TEMPLATE="busybox",
                               DATABASE__MIGRATE_ON_START="false",
                               SERVER__DRAIN_SECS="2",
                               WORKERS__HEARTBEAT_TTL_SECS="3",
                               WORKERS__LOST_AFTER_SECS="6",
                               RATE_LIMIT__PER_SECOND="10000",
                               RATE_LIMIT__BURST="10000",
                               SERVER__REQUESTS_PER_IP_PER_SECOND="100000",
                               SERVER__REQUESTS_PER_IP_BURST="100000")
        self.env["REDIS_URL"] = f"redis://127.0.0.1:{self.redis_port}"
        self.standin = StandIn.spawn()
        self.provider = self.standin.url
        credential = os.path.join(workdir, "provider.key")
        with open(credential, "w") as handle:
            handle.write(OPENAI_SECRET + "\n")
        self.config = os.path.join(workdir, "sandbase.toml")
        with open(self.config, "w") as handle:
            handle.write(STORE_CONFIG.format(upstream=self.provider, credential=credential))
        self.ports = [(free_port(), free_port()) for _ in range(2)]
        self.gateways = [None, None]
        self.public, self.internal = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.public}"
        self.workers = []
        self.haproxy = None

    def start_redis(self):
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=open(os.path.join(self.workdir, "redis.log"), "a"), stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while subprocess.run(["redis-cli", "-p", str(self.redis_port), "ping"],
                             capture_output=True, text=True).stdout.strip() != "PONG":
            assert time.time() < deadline, "redis-server did not start"
            time.sleep(0.1)

    def migrate(self):
        subprocess.run([BINARY, "migrate"], env=self.env, check=True, capture_output=True)

    def start_gateway(self, index):
        public, internal = self.ports[index]
        log = os.path.join(self.workdir, f"gateway-{index}.log")
        env = {**self.env, "SANDBASE_SERVER__INTERNAL_LISTEN": f"127.0.0.1:{internal}"}
        process = subprocess.Popen(
            [BINARY, "server", "--listen", f"127.0.0.1:{public}", "--config", self.config],
            env=env, stdout=subprocess.DEVNULL, stderr=open(log, "a"))
        self.gateways[index] = process
        wait_ready(f"http://127.0.0.1:{public}", process, log)

    def stop_gateway(self, index, how=signal.SIGTERM):
        process = self.gateways[index]
        process.send_signal(how)
        process.wait(timeout=60)

    def start_haproxy(self):
        servers = "\n".join(f"    server g{i} 127.0.0.1:{p} check" for i, (p, _) in enumerate(self.ports))
        internals = "\n".join(f"    server i{i} 127.0.0.1:{p} check" for i, (_, p) in enumerate(self.ports))
        config = os.path.join(self.workdir, "haproxy.cfg")
        with open(config, "w") as handle:
            handle.write(HAPROXY_CONFIG.format(public=self.public, internal=self.internal,
                                               public_servers=servers, internal_servers=internals))
        check = subprocess.run(["haproxy", "-c", "-f", config], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.haproxy = subprocess.Popen(["haproxy", "-db", "-f", config],
                                        stdout=subprocess.DEVNULL,
                                        stderr=open(os.path.join(self.workdir, "haproxy.log"), "w"))
        wait_ready(self.url)

    def start_worker(self, index):
        """Worker `index` (a fixed id, namespace and directory, so a restart is the same node),
        registered through haproxy; its templates are busybox's only (built in a moment)."""
        worker_id = f"drill-worker-{index}"
        minted = subprocess.run(
            [BINARY, "admin", "worker-credential", "--worker-id", worker_id],
            env={"PATH": os.environ.get("PATH", ""), "SANDBASE_WORKERS__NODE_TOKEN": NODE_TOKEN},
            capture_output=True, text=True, check=True)
        workdir = os.path.join(self.workdir, f"worker-{index}")
        os.makedirs(os.path.join(workdir, "templates"), exist_ok=True)
        namespace = f"sandbase-test-drill-{self.tag}-{index}"
        port = self.worker_ports[index]
        process = subprocess.Popen(
            [BINARY, "worker", "--gateway", f"http://127.0.0.1:{self.internal}",
             "--worker-listen", f"127.0.0.1:{port}", "--egress-pool", "none",
             "--worker-id", worker_id, "--namespace", namespace, "--containerd-socket", SOCKET,
             "--run-dir", os.path.join(workdir, "run"),
             "--id-base", str(5_000_000 + index * 65_536),
             "--pool", f"busybox={self.POOL}", "--templates-dir", os.path.join(workdir, "templates"),
             "--capacity", "60"],
            env={"PATH": os.environ.get("PATH", ""),
                 "SANDBASE_WORKER_CREDENTIAL": minted.stdout.strip(),
                 "SANDBASE_AGENT_BINARY": os.environ.get("SANDBASE_AGENT_BINARY", "")},
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "worker.log"), "a"))
        while len(self.workers) <= index:
            self.workers.append(None)
        self.workers[index] = (process, namespace, worker_id)

    def containers(self, index):
        namespace = self.workers[index][1]
        listed = subprocess.run(["ctr", "--address", SOCKET, "-n", namespace, "containers", "ls", "-q"],
                                capture_output=True, text=True)
        return [line for line in listed.stdout.split() if line]

    POOL = 2

    def unaccounted(self, index):
        """Containers on worker `index` beyond its warm pool and the sandboxes the database
        has running there: orphans, when positive."""
        worker_id = self.workers[index][2]
        live = int(self.sql(f"SELECT count(*) FROM sandboxes WHERE worker_id = '{worker_id}' "
                            "AND state <> 'stopped'"))
        return len(self.containers(index)) - self.POOL - live

    def explain(self):
        """Each worker's containers and what the database says of them."""
        lines = []
        for index in range(len(self.workers)):
            for container in self.containers(index):
                row = self.sql("SELECT state || ' ' || coalesce(stop_reason, '') || ' ' || "
                               f"coalesce(worker_id, '') FROM sandboxes WHERE id::text = '{container}'")
                lines.append(f"worker {index}: {container}: {row or 'no row'}")
        return "\n".join(lines)

    def settle(self, deadline=60):
        """Until no worker has a container unaccounted for; their counts."""
        end = time.time() + deadline
        while True:
            counts = [self.unaccounted(index) for index in range(len(self.workers))]
            if all(count <= 0 for count in counts) or time.time() > end:
                return counts
            time.sleep(0.5)

    def request(self, method, path, token, body=None, base=None):
        import json
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{base or self.url}{path}", data=data, method=method,
            headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            text = answer.read()
            return json.loads(text) if text else None

    def signup(self):
        """A new team's key and id (starter credits)."""
        signed = api.signup(self.url, "Drill")
        return signed["api_key"]["token"], signed["team"]["id"]

    def sql(self, query):
        done = subprocess.run(["psql", self.env["DATABASE_URL"], "-qAt", "-c", query],
                              capture_output=True, text=True, check=True)
        return done.stdout.strip()

    def wait_for_workers(self, count, deadline=120):
        """Until `count` workers heartbeat and the busybox template is offered."""
        token = self.signup()[0]
        end = time.time() + deadline
        while time.time() < end:
            seen = self.sql("SELECT count(*) FROM workers "
                            "WHERE last_seen_at > now() - interval '5 seconds'")
            templates = self.request("GET", "/v1/templates", token)["templates"]
            if int(seen or 0) >= count and any(t["name"] == "busybox" for t in templates):
                return
            time.sleep(0.5)
        logs = "".join(open(os.path.join(self.workdir, f"worker-{i}", "worker.log")).read()[-1500:]
                       for i in range(len(self.workers)))
        raise RuntimeError(f"workers never ready: {logs}")

    def close(self):
        for entry in self.workers:
            if entry and entry[0].poll() is None:
                entry[0].terminate()
                try:
                    entry[0].wait(timeout=60)
                except subprocess.TimeoutExpired:
                    entry[0].kill()
        for process in self.gateways:
            if process and process.poll() is None:
                process.kill()
                process.wait()
        if self.haproxy:
            self.haproxy.terminate()
            self.haproxy.wait()
        if self.redis:
            self.redis.kill()
            self.redis.wait()
        self.standin.close()


@pytest.fixture(scope="module")
def cluster():
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is missing (scripts/setup --test installs it)")
    workdir = tempfile.mkdtemp(prefix="sandbase-drill-")
    database, database_url = fresh_database("sandbase_test_drill")
    cluster = Cluster(workdir, database_url)
    cluster.tag = uuid.uuid4().hex[:8]
    cluster.worker_ports = [free_port() for _ in range(3)]
    cluster.migrate()
    try:
        for index in range(2):
            cluster.start_gateway(index)
        cluster.start_haproxy()
        for index in range(3):
            cluster.start_worker(index)
        cluster.wait_for_workers(3)
        yield cluster
    finally:
        cluster.close()
        drop_database(database)
