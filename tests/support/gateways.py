"""Real gateways for the Python suites: a fresh database, `sandbase server` started with its
log in a file (a pipe nobody reads fills up, and the gateway then blocks on it) and waited
for until it is ready."""

import os
import json
import socket
import subprocess
import time
import urllib.request
import uuid

DATABASE_URL = os.environ.get(
    "SANDBASE_TEST_DATABASE_URL", "postgres://sandbase:sandbase@127.0.0.1:5432/sandbase"
)
REDIS_URL = os.environ.get("SANDBASE_TEST_REDIS_URL", "redis://127.0.0.1:6379")
BINARY = os.path.abspath(os.environ.get("SANDBASE_BINARY", "target/debug/sandbase"))
SOCKET = os.environ.get("SANDBASE_CONTAINERD_SOCKET", "/run/sandbase/containerd.sock")
TEMPLATES = os.path.dirname(
    os.environ.get("SANDBASE_BASE_TARBALL", "/var/lib/sandbase/templates/base.tar")
)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def psql(sql, database=DATABASE_URL):
    subprocess.run(["psql", database, "-qAt", "-c", sql], check=True, capture_output=True)


def fresh_database(prefix):
    """A new database's name and URL."""
    name = f"{prefix}_{uuid.uuid4().hex}"
    psql(f'CREATE DATABASE "{name}"')
    return name, f"{DATABASE_URL.rsplit('/', 1)[0]}/{name}"


def drop_database(name):
    psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def gateway_env(database_url, prefix, workdir, **settings):
    """A gateway's environment: the database, a Redis prefix and session secret of its own,
    sign-ups unthrottled, artifacts under `workdir`; `settings` adds `SANDBASE_*` variables
    (`WORKERS__NODE_TOKEN="…"`)."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        "SANDBASE_REDIS__KEY_PREFIX": f"sandbase-{prefix}-test:{uuid.uuid4().hex}:",
        "SANDBASE_AUTH__JWT_SECRET": uuid.uuid4().hex + uuid.uuid4().hex,
        "SANDBASE_AUTH__SIGNUPS_PER_HOUR": "1000000",
        "SANDBASE_RUNS__ARTIFACTS_DIR": os.path.join(workdir, "artifacts"),
        # No load balancer in front: stop at once on SIGTERM.
        "SANDBASE_SERVER__DRAIN_SECS": "0",
    }
    env.update({f"SANDBASE_{name}": value for name, value in settings.items()})
    return env


def start_gateway(env, port, log, config=None):
    """`sandbase server` on `port`, once its /readyz answers; its URL."""
    process = subprocess.Popen(
        [BINARY, "server", "--listen", f"127.0.0.1:{port}"]
        + (["--config", config] if config else []),
        env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, process, log)
    return process, url


def wait_ready(url, process=None, log=None, deadline=60.0):
    """Until `url`/readyz answers 200; the log's tail when `process` exits or time runs out."""
    end = time.time() + deadline
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if (process is not None and process.poll() is not None) or time.time() > end:
            raise RuntimeError(open(log).read()[-4000:] if log else f"{url} never became ready")
        time.sleep(0.1)


def proxy_ports():
    """A base port for a worker's egress proxy: TCP `base` to `base + 2` and UDP `base + 3`
    free on every address, below the kernel's ephemeral range."""
    import random
    for _ in range(1000):
        base = random.randrange(20_000, 32_000)
        sockets = []
        try:
            for offset, kind in ((0, socket.SOCK_STREAM), (1, socket.SOCK_STREAM),
                                 (2, socket.SOCK_STREAM), (3, socket.SOCK_DGRAM)):
                sock = socket.socket(socket.AF_INET, kind)
                sockets.append(sock)
                sock.bind(("0.0.0.0", base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no four free ports for the egress proxy")


def egress_args(upstream, names, pinned=()):
    """A worker's egress options: the node's pool and a proxy port of its own, `names`
    resolved to `upstream` (tests/support/upstream.py), its CA trusted, and `pinned` NAME=ADDRESS
    pairs besides."""
    args = ["--egress-pool", "10.213.0.0", "--egress-proxy-port", str(proxy_ports()),
            "--egress-extra-ca", upstream.ca]
    for pin in [f"{name}={upstream.address}" for name in names] + list(pinned):
        args += ["--egress-resolve", pin]
    return args


def internal_tls(workdir):
    """TLS for the internal channel (a CA made for the run, one certificate for 127.0.0.1 that
    the gateways and the worker both serve and present): the gateways' settings (for
    `gateway_env`) and the worker's options. Credentials travel to workers only over it."""
    from tests.support import certs
    ca, chain, key = certs.issue(os.path.join(workdir, "internal-tls"), ["127.0.0.1", "localhost"],
                                 "serverAuth,clientAuth")
    settings = {"INTERNAL_TLS__CA_FILE": ca, "INTERNAL_TLS__CERT_FILE": chain,
                "INTERNAL_TLS__KEY_FILE": key}
    return settings, ["--tls-ca", ca, "--tls-cert", chain, "--tls-key", key]


def start_worker(internal, unique, workdir, node_token, prefix, egress=("--egress-pool", "none"),
                 tls=()):
    """`sandbase worker` for the gateway whose internal listener is `internal`, with a
    credential minted from `node_token`, in a containerd namespace of its own (named so that
    scripts/test clears it if the test dies), without egress unless `egress` gives its
    options (`egress_args`), over TLS when `tls` gives its options (`internal_tls`);
    (process, namespace)."""
    worker_id = f"{prefix}-{unique}"
    minted = subprocess.run(
        [BINARY, "admin", "worker-credential", "--worker-id", worker_id],
        env={"PATH": os.environ.get("PATH", ""), "SANDBASE_WORKERS__NODE_TOKEN": node_token},
        capture_output=True, text=True, check=True)
    slot = int(unique[:4], 16) % 1000
    namespace = f"sandbase-test-{prefix}-{unique}"
    process = subprocess.Popen(
        [BINARY, "worker", "--gateway", internal, *tls,
         "--worker-listen", f"127.0.0.1:{free_port()}", *egress,
         "--worker-id", worker_id, "--namespace", namespace, "--containerd-socket", SOCKET,
         "--run-dir", os.path.join(workdir, "run"), "--id-base", str(4_000_000 + slot * 65_536),
         "--pool", "busybox=0", "--templates-dir", TEMPLATES],
        env={"PATH": os.environ.get("PATH", ""),
             "SANDBASE_WORKER_CREDENTIAL": minted.stdout.strip(),
             "SANDBASE_AGENT_BINARY": os.environ.get("SANDBASE_AGENT_BINARY", "")},
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "worker.log"), "w"),
    )
    return process, namespace


def wait_for_base(url, token, worker, workdir):
    """Until a worker offers the `base` template (built on its first start)."""
    deadline = time.time() + 180
    while True:
        request = urllib.request.Request(
            f"{url}/v1/templates", headers={"authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request) as answer:
            templates = json.loads(answer.read())
        if any(t["name"] == "base" for t in templates["templates"]):
            return
        if worker.poll() is not None or time.time() > deadline:
            raise RuntimeError(open(os.path.join(workdir, "worker.log")).read()[-4000:])
        time.sleep(0.5)
