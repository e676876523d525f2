"""The OpenAPI document against the server it describes: schemathesis (every check, a fixed
seed, settings in schemathesis.toml, hooks in fuzz_hooks.py) must report no failure, twice:
against a real `sandbase dev` without a worker (its own database, Redis prefix and state),
and against a real gateway *with* a worker (`sandbase server` and `sandbase worker` on
SandBase's containerd), 20 examples per operation and the stateful phase, where the
operations on a sandbox reach a real one the fuzzer's team shares (made again when the fuzzer
destroys it). Rate limits are raised so that the fuzzer's bursts are answered rather than
refused, and it runs as a team of its own, signed up again whenever it revokes its own key."""

import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
from tests.support.gateways import (
    BINARY, REDIS_URL, drop_database, free_port, fresh_database, gateway_env, start_gateway,
    start_worker, wait_ready)

SCHEMATHESIS = os.path.join(os.path.dirname(sys.executable), "schemathesis")
UNTHROTTLED = {
    "AUTH__SIGNUPS_PER_HOUR": "1000000",
    "AUTH__FAILED_AUTH_PER_MINUTE": "1000000",
    "RATE_LIMIT__PER_SECOND": "100000",
    "RATE_LIMIT__BURST": "100000",
    "SERVER__REQUESTS_PER_IP_PER_SECOND": "100000",
    "SERVER__REQUESTS_PER_IP_BURST": "100000",
}
NODE_TOKEN = "fuzz-test-node-token-0123456789abcdef"


def start_dev(database_url, workdir):
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": workdir,
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        "SANDBASE_REDIS__KEY_PREFIX": f"sandbase-fuzz-test:{os.urandom(8).hex()}:",
        "SANDBASE_SERVER__INTERNAL_LISTEN": f"127.0.0.1:{free_port()}",
        **{f"SANDBASE_{name}": value for name, value in UNTHROTTLED.items()},
    }
    log = open(os.path.join(workdir, "dev.log"), "w")
    process = subprocess.Popen(
        [BINARY, "dev", "--no-worker", "--listen", f"127.0.0.1:{port}",
         "--state-dir", os.path.join(workdir, "state")],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, process, os.path.join(workdir, "dev.log"))
    return process, url


def errors_in(logs):
    """The error lines of the servers' logs, for a failure's message."""
    lines = []
    for log in logs:
        if os.path.exists(log):
            lines += [line for line in open(log, errors="replace") if "ERROR" in line]
    return "".join(lines[-40:])


def fuzz(url, *options, env=(), logs=()):
    """Runs the fuzzer against `url`; its whole report, after its summary line is printed
    into the suite's output and its exit status checked."""
    env = {**os.environ, "SANDBASE_FUZZ_URL": url, "SCHEMATHESIS_HOOKS": "fuzz_hooks",
           "PYTHONPATH": HERE, "NO_COLOR": "1", **dict(env)}
    started = time.time()
    fuzzed = subprocess.run(
        [SCHEMATHESIS, "--config-file", os.path.join(HERE, "schemathesis.toml"), "run",
         f"{url}/v1/openapi.json", "--url", url, "--no-color", *options],
        env=env, cwd=HERE, capture_output=True, text=True, timeout=900)
    report = fuzzed.stdout + fuzzed.stderr
    # The fuzzer's own summary line, in the suite's output.
    print(report.strip().splitlines()[-1], f"({time.time() - started:.0f} s)")
    assert fuzzed.returncode == 0, report[-20000:] + "\nserver errors:\n" + errors_in(logs)
    # Every operation but the WebSocket attachment it cannot speak.
    tested = re.search(r"Tested: (\d+)", report)
    assert tested and int(tested.group(1)) >= 80, report[-3000:]
    return report


def test_the_fuzzer_finds_nothing():
    workdir = tempfile.mkdtemp(prefix="sandbase-fuzz-")
    database, database_url = fresh_database("sandbase_test_fuzz")
    process, url = start_dev(database_url, workdir)
    try:
        fuzz(url)
    finally:
        process.terminate()
        process.wait(timeout=30)
        drop_database(database)
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_fuzzer_with_a_worker_finds_nothing():
    workdir = tempfile.mkdtemp(prefix="sandbase-fuzz-worker-")
    database, database_url = fresh_database("sandbase_test_fuzz_worker")
    internal = f"127.0.0.1:{free_port()}"
    # The vault and previews configured, so that secrets and previews answer for real.
    keys = os.path.join(workdir, "vault.keys")
    with open(keys, "w") as handle:
        handle.write("1:" + base64.b64encode(os.urandom(32)).decode() + "\n")
    env = gateway_env(database_url, "fuzz", workdir, WORKERS__NODE_TOKEN=NODE_TOKEN,
                      SANDBOXES__DEFAULT_TEMPLATE="busybox", SERVER__INTERNAL_LISTEN=internal,
                      VAULT__KEY_FILE=keys, PREVIEWS__DOMAIN="preview.localhost",
                      PREVIEWS__SCHEME="http",
                      # The fuzzer's own sandboxes must not spend what its shared one needs.
                      BILLING__STARTER_CREDITS="\"100000\"", **UNTHROTTLED)
    gateway, url = start_gateway(env, free_port(), os.path.join(workdir, "gateway.log"))
    worker, _ = start_worker(f"http://{internal}", uuid.uuid4().hex, workdir, NODE_TOKEN,
                             "fuzz")
    try:
        wait_for_worker(url, worker, workdir)
        sent = os.path.join(workdir, "sent-to-the-shared-sandbox")
        logs = [os.path.join(workdir, name) for name in ("gateway.log", "worker.log")]
        report = fuzz(url, "--max-examples", "20", env={"SANDBASE_FUZZ_SANDBOX": sent},
                      logs=logs)
        # Every phase ran, the stateful one included, and the operations on a sandbox
        # reached a running one hundreds of times.
        for phase in ("Coverage", "Fuzzing", "Stateful"):
            assert re.search(rf"✅\s+{phase}", report), report[-3000:]
        count, why = open(sent).read().split("\n", 1)
        assert int(count) >= 200, f"{count} calls went to the shared sandbox; last failure: {why}"
        assert worker.poll() is None, open(os.path.join(workdir, "worker.log")).read()[-4000:]
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        gateway.terminate()
        gateway.wait(timeout=30)
        drop_database(database)
        shutil.rmtree(workdir, ignore_errors=True)


def wait_for_worker(url, worker, workdir):
    """Until a sandbox can be made (the worker registered, its templates built)."""
    from tests.support.api import call, new_key
    token = new_key(url, "Fuzz")
    deadline = time.time() + 120
    while True:
        try:
            made = call(url, "POST", "/v1/sandboxes", token, {"timeout_secs": 60})
            call(url, "DELETE", f"/v1/sandboxes/{made['id']}", token)
            return
        except urllib.error.HTTPError as refusal:
            if worker.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{refusal.code} {refusal.read()!r}\n" + open(
                    os.path.join(workdir, "worker.log")).read()[-4000:])
        time.sleep(0.5)
