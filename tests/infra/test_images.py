"""The OCI images infra/images/build makes (buildah, offline, from Debian packages and the
binaries just built), imported into SandBase's own containerd and run there: each answers
`sandbase --version` as the binary does; the gateway's runs as uid 65532 and, started from
its image against the test PostgreSQL and Redis, answers /readyz and serves the dashboard; the worker's
holds what a node needs (containerd, runc, nftables, iproute2, the static agent, the
templates)."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BINARY = os.path.abspath(os.environ.get("SANDBASE_BINARY", "target/debug/sandbase"))
AGENT = os.environ.get("SANDBASE_AGENT_BINARY")
SOCKET = os.environ.get("SANDBASE_CONTAINERD_SOCKET", "/run/sandbase/containerd.sock")
DATABASE_URL = os.environ.get(
    "SANDBASE_TEST_DATABASE_URL", "postgres://sandbase:sandbase@127.0.0.1:5432/sandbase")
REDIS_URL = os.environ.get("SANDBASE_TEST_REDIS_URL", "redis://127.0.0.1:6379")

pytestmark = pytest.mark.skipif(
    shutil.which("buildah") is None or not os.path.exists(SOCKET),
    reason="buildah and SandBase's containerd (scripts/setup --test) are needed")


def version():
    return subprocess.run([BINARY, "--version"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    out = tmp_path_factory.mktemp("images")
    args = [os.path.join(ROOT, "infra", "images", "build"), "--binary", BINARY, "--out", str(out)]
    if AGENT:
        args += ["--agent", AGENT]
    built = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    print(built.stdout)
    namespace = f"sandbase-test-images-{uuid.uuid4().hex[:8]}"
    tag = version().split()[1]
    for name in ("gateway", "worker"):
        imported = ctr(namespace, "images", "import", str(out / f"sandbase-{name}.tar"))
        assert imported.returncode == 0, imported.stderr
    yield namespace, {name: f"sandbase/{name}:{tag}" for name in ("gateway", "worker")}
    for task in ctr(namespace, "tasks", "ls", "-q").stdout.split():
        ctr(namespace, "tasks", "kill", "-s", "SIGKILL", task)
        time.sleep(0.2)
        ctr(namespace, "tasks", "rm", "-f", task)
    for container in ctr(namespace, "containers", "ls", "-q").stdout.split():
        ctr(namespace, "containers", "rm", container)
    for image in ctr(namespace, "images", "ls", "-q").stdout.split():
        ctr(namespace, "images", "rm", "--sync", image)
    for _ in range(3):
        listed = ctr(namespace, "snapshots", "ls").stdout.splitlines()[1:]
        for snapshot in [line.split()[0] for line in listed if line.strip()]:
            ctr(namespace, "snapshots", "rm", snapshot)
    subprocess.run(["ctr", "--address", SOCKET, "namespaces", "rm", namespace],
                   capture_output=True)


def ctr(namespace, *args):
    return subprocess.run(["ctr", "--address", SOCKET, "-n", namespace, *args],
                          capture_output=True, text=True, timeout=300)


def run(images, image, *command, net_host=False, env=()):
    namespace, names = images
    extra = ["--net-host"] if net_host else []
    for pair in env:
        extra += ["--env", pair]
    name = f"t-{uuid.uuid4().hex[:8]}"
    return ctr(namespace, "run", "--rm", *extra, names[image], name, *command)


def test_both_images_answer_the_binarys_version(images):
    for image in ("gateway", "worker"):
        answered = run(images, image, "/usr/local/bin/sandbase", "--version")
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.strip() == version()


def test_the_gateway_image_runs_unprivileged_and_serves(images):
    namespace, names = images
    answered = run(images, "gateway", "id", "-u")
    assert answered.stdout.strip() == "65532"
    # The image's default command, on the test database and Redis (host network).
    port = free_port()
    name = f"t-{uuid.uuid4().hex[:8]}"
    env = [f"DATABASE_URL={DATABASE_URL}", f"REDIS_URL={REDIS_URL}",
           f"SANDBASE_AUTH__JWT_SECRET={uuid.uuid4().hex * 2}",
           f"SANDBASE_REDIS__KEY_PREFIX=sandbase-images-test:{uuid.uuid4().hex}:",
           f"SANDBASE_SERVER__INTERNAL_LISTEN=127.0.0.1:{free_port()}"]
    dashboard = os.path.exists(os.path.join(ROOT, "web", "dist", "index.html"))
    if dashboard:
        # Where the chart points server.web_dir.
        env.append("SANDBASE_SERVER__WEB_DIR=/usr/share/sandbase/web")
    log = f"/tmp/{name}.log"
    args = ["run", "-d", "--net-host", "--log-uri", f"file://{log}"]
    for pair in env:
        args += ["--env", pair]
    # The image's own entrypoint and command, but for the address (a free port).
    started = ctr(namespace, *args, names["gateway"], name, "/usr/local/bin/sandbase", "server",
                  "--listen", f"127.0.0.1:{port}")
    assert started.returncode == 0, started.stderr
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                assert answer.status == 200
                break
        except OSError:
            if time.time() > deadline:
                raise AssertionError(open(log).read()[-3000:])
            time.sleep(0.3)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/openapi.json", timeout=5) as answer:
        assert json.load(answer)["info"]["title"]
    if dashboard:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
            assert answer.headers["content-type"].startswith("text/html")
    ctr(namespace, "tasks", "kill", "-s", "SIGTERM", name)
    os.unlink(log)


def test_the_worker_image_holds_what_a_node_needs(images):
    checks = [
        ("containerd", "--version"), ("runc", "--version"), ("nft", "--version"),
        ("ip", "-V"), ("ctr", "--version"), ("nsenter", "--version"), ("tar", "--version"),
        ("/bin/busybox", "true"),
    ]
    for command in checks:
        answered = run(images, "worker", *command)
        assert answered.returncode == 0, (command, answered.stderr)
    listed = run(images, "worker", "ls", "-l", "/usr/local/bin/sandbase-agent",
                 "/usr/share/sandbase/templates/")
    assert listed.returncode == 0, listed.stderr
    assert "base.tar" in listed.stdout
    # The agent runs in root file systems without a C library: it must be static.
    static = run(images, "worker", "sh", "-c", "ldd /usr/local/bin/sandbase-agent 2>&1 || true")
    assert "not a dynamic executable" in static.stdout or "statically linked" in static.stdout


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
