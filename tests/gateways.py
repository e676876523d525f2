"""Real gateways for the Python suites: a fresh database, `sandbase server` started with its
log in a file (a pipe nobody reads fills up, and the gateway then blocks on it) and waited
for until it is ready."""

import os
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


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def psql(sql):
    subprocess.run(["psql", DATABASE_URL, "-qAt", "-c", sql], check=True, capture_output=True)


def fresh_database(prefix):
    """A new database's name and URL."""
    name = f"{prefix}_{uuid.uuid4().hex}"
    psql(f'CREATE DATABASE "{name}"')
    return name, f"{DATABASE_URL.rsplit('/', 1)[0]}/{name}"


def drop_database(name):
    psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_gateway(env, port, log, config=None):
    """`sandbase server` on `port`, once its /readyz answers; its URL."""
    process = subprocess.Popen(
        [BINARY, "server", "--listen", f"127.0.0.1:{port}"]
        + (["--config", config] if config else []),
        env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz") as answer:
                if answer.status == 200:
                    return process, url
        except OSError:
            pass
        if process.poll() is not None or time.time() > deadline:
            raise RuntimeError(open(log).read()[-4000:])
        time.sleep(0.1)
