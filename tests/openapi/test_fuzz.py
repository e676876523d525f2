"""The OpenAPI document against the server it describes: schemathesis (every check, a fixed
seed, settings in schemathesis.toml, hooks in fuzz_hooks.py) against a real `sandbase dev`
(its own database, Redis prefix and state; no worker) must report no failure. Its rate limits
are raised so that the fuzzer's bursts are answered rather than refused, and it runs as a
team of its own, signed up again whenever it revokes its own key."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
from tests.support.gateways import (
    BINARY, REDIS_URL, drop_database, free_port, fresh_database, wait_ready)

SCHEMATHESIS = os.path.join(os.path.dirname(sys.executable), "schemathesis")


def start_dev(database_url, workdir):
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": workdir,
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        "SANDBASE_REDIS__KEY_PREFIX": f"sandbase-fuzz-test:{os.urandom(8).hex()}:",
        "SANDBASE_SERVER__INTERNAL_LISTEN": f"127.0.0.1:{free_port()}",
        "SANDBASE_AUTH__SIGNUPS_PER_HOUR": "1000000",
        "SANDBASE_AUTH__FAILED_AUTH_PER_MINUTE": "1000000",
        "SANDBASE_RATE_LIMIT__PER_SECOND": "100000",
        "SANDBASE_RATE_LIMIT__BURST": "100000",
        "SANDBASE_SERVER__REQUESTS_PER_IP_PER_SECOND": "100000",
        "SANDBASE_SERVER__REQUESTS_PER_IP_BURST": "100000",
    }
    log = open(os.path.join(workdir, "dev.log"), "w")
    process = subprocess.Popen(
        [BINARY, "dev", "--no-worker", "--listen", f"127.0.0.1:{port}",
         "--state-dir", os.path.join(workdir, "state")],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, process, os.path.join(workdir, "dev.log"))
    return process, url


def test_the_fuzzer_finds_nothing():
    workdir = tempfile.mkdtemp(prefix="sandbase-fuzz-")
    database, database_url = fresh_database("sandbase_test_fuzz")
    process, url = start_dev(database_url, workdir)
    try:
        env = {**os.environ, "SANDBASE_FUZZ_URL": url, "SCHEMATHESIS_HOOKS": "fuzz_hooks",
               "PYTHONPATH": HERE, "NO_COLOR": "1"}
        fuzzed = subprocess.run(
            [SCHEMATHESIS, "--config-file", os.path.join(HERE, "schemathesis.toml"), "run",
             f"{url}/v1/openapi.json", "--url", url, "--no-color"],
            env=env, cwd=HERE, capture_output=True, text=True, timeout=900)
        report = fuzzed.stdout + fuzzed.stderr
        # The fuzzer's own summary line, in the suite's output.
        print(report.strip().splitlines()[-1])
        assert fuzzed.returncode == 0, report[-20000:]
        # Every operation but the WebSocket attachment it cannot speak.
        tested = re.search(r"Tested: (\d+)", report)
        assert tested and int(tested.group(1)) >= 80, report[-3000:]
    finally:
        process.terminate()
        process.wait(timeout=30)
        drop_database(database)
        shutil.rmtree(workdir, ignore_errors=True)
