"""The systemd units in infra/systemd, checked by systemd itself: `systemd-analyze verify`
(directives, dependencies, the executables — the units' /usr/local/bin/sandbase pointed at
the binary just built), and the gateway's sandboxing scored by `systemd-analyze security`."""

import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
UNITS = os.path.join(HERE, "..", "..", "infra", "systemd")
BINARY = os.path.abspath(os.environ.get("SANDBASE_BINARY", "target/debug/sandbase"))
NAMES = ["sandbase-gateway.service", "sandbase-worker.service", "sandbase-containerd.service"]

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")


def installed(tmp_path, binary=BINARY):
    for name in NAMES:
        with open(os.path.join(UNITS, name)) as unit:
            text = unit.read().replace("/usr/local/bin/sandbase", binary)
        (tmp_path / name).write_text(text)
    return [str(tmp_path / name) for name in NAMES]


def analyze(*args, cwd):
    return subprocess.run(["systemd-analyze", *args], cwd=cwd, capture_output=True, text=True)


def test_the_units_verify(tmp_path):
    verified = analyze("verify", *installed(tmp_path), cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr.strip() == "", verified.stderr


def test_a_unit_naming_a_missing_binary_fails_verification(tmp_path):
    verified = analyze("verify", *installed(tmp_path, "/nonexistent/sandbase"), cwd=tmp_path)
    assert verified.returncode != 0
    assert "/nonexistent/sandbase" in verified.stderr


def test_only_the_worker_is_privileged_and_the_gateway_is_locked_down(tmp_path):
    installed(tmp_path)
    gateway = (tmp_path / "sandbase-gateway.service").read_text()
    for directive in ["DynamicUser=yes", "NoNewPrivileges=yes", "CapabilityBoundingSet=\n",
                      "ProtectSystem=strict", "SystemCallFilter=@system-service"]:
        assert directive in gateway, directive
    # systemd's own exposure score: at most 2.0 of 10 ("OK").
    scored = analyze("security", "--offline=yes", "--threshold=20",
                     str(tmp_path / "sandbase-gateway.service"), cwd=tmp_path)
    assert scored.returncode == 0, scored.stdout[-2000:]
    assert "DynamicUser" not in (tmp_path / "sandbase-worker.service").read_text()
