"""Remote MCP servers an agent run names by URL: reached through the egress guard, with a
credential the vault keeps (never journaled, answered or logged), or a team secret bound to
the server's host; an internal address is refused before anything connects to it."""

import json
import os
import socket
import subprocess
import sys
import urllib.error

import pytest

from tests.support.upstream import Namespace

SECRET = "S3CR3T"
UPSTREAM = os.path.join(os.path.dirname(os.path.dirname(__file__)), "mcp", "upstream.py")
# Where a run's words can land: every table of the journal, the audit log, the secrets.
TABLES = ["agent_runs", "agent_run_steps", "agent_run_events", "agent_run_items",
          "agent_run_inputs", "audit_events", "api_keys"]


def error_of(refused):
    body = json.loads(refused.value.read())
    return refused.value.code, body["error"]["code"], body["error"]["message"]


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """The MCP stand-in at a public-looking address in a namespace of its own, taking only
    `Bearer S3CR3T`; (its URL, its calls file)."""
    calls = tmp_path_factory.mktemp("remote-mcp") / "calls"
    calls.write_text("")
    with Namespace() as space:
        space.popen([sys.executable, UPSTREAM, "8000", str(calls), space.address], 8000,
                    env={**os.environ, "UPSTREAM_MCP_SECRET": SECRET})
        yield f"http://{space.address}:8000/mcp", calls


def rows_holding(cluster, text):
    """How many rows of each journal table hold `text` anywhere."""
    found = {}
    for table in TABLES:
        out = subprocess.run(
            ["psql", cluster.database_url, "-qAt", "-c",
             f"SELECT count(*) FROM {table} t WHERE t::text LIKE '%{text}%'"],
            check=True, capture_output=True, text=True).stdout.strip()
        found[table] = int(out)
    return found


def test_a_remote_server_is_called_with_a_credential_that_is_nowhere_else(team, cluster, remote):
    url, calls = remote
    echo = {"tool": "remote__echo", "arguments": {"text": "over the wire"}}
    tool = {"type": "mcp", "server_url": url, "server_label": "remote", "credential": SECRET}
    run = team.run("openai/gpt-test", "remote-echo", [echo, {"text": "heard"}], tools=[tool])
    done = team.wait(run["id"])
    assert done["status"] == "idle" and done["tool_calls"] == 1, done
    events = team.events(run["id"])
    outputs = [e["data"]["output"] for e in events if e["type"] == "tool.completed"]
    assert outputs == ["upstream heard: over the wire"], [e["data"] for e in events if e["type"] == "error"]
    assert calls.read_text().count("echo") == 1
    # The token is in no answer, no journal row and no log line.
    answers = [team.call("GET", f"/v1/agent-runs/{run['id']}"), run, events,
               team.call("GET", f"/v1/agent-runs/{run['id']}/steps"),
               team.call("GET", f"/v1/agent-runs/{run['id']}/turns"),
               team.call("GET", "/v1/agent-runs"),
               team.call("GET", "/v1/audit?limit=200")]
    assert SECRET not in json.dumps(answers)
    assert run["tools"] == [{"type": "mcp", "server_url": url, "server_label": "remote"}], run
    assert set(rows_holding(cluster, SECRET).values()) == {0}, rows_holding(cluster, SECRET)
    for name in os.listdir(cluster.workdir):
        path = os.path.join(cluster.workdir, name)
        if name.endswith(".log") and os.path.isfile(path):
            assert SECRET not in open(path, errors="replace").read(), name


def test_a_team_secret_must_be_bound_to_the_servers_host(team, remote):
    url, _ = remote
    team.call("POST", "/v1/secrets", {"name": "elsewhere", "value": SECRET,
                                      "hosts": ["api.example.com"],
                                      "inject": {"header": "Authorization",
                                                 "format": "Bearer {value}"}})
    # A secret bound to other hosts is refused: it would send the credential elsewhere.
    tool = {"type": "mcp", "server_url": url, "server_label": "remote",
            "credential_secret": "elsewhere"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        team.run("openai/gpt-test", "remote-secret", [{"text": "x"}], tools=[tool])
    assert error_of(refused)[:2] == (422, "secret_not_bound")
    with pytest.raises(urllib.error.HTTPError) as refused:
        team.run("openai/gpt-test", "remote-secret", [{"text": "x"}],
                 tools=[{**tool, "credential_secret": "missing"}])
    assert error_of(refused)[:2] == (422, "unknown_credential")
    # Without its credential the server refuses the listing: the run says so and goes on.
    run = team.run("openai/gpt-test", "remote-none", [{"text": "no tools"}],
                   tools=[{"type": "mcp", "server_url": url, "server_label": "remote"}])
    done = team.wait(run["id"])
    assert done["status"] == "idle", done
    errors = [e["data"] for e in team.events(run["id"]) if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["mcp_server_unreachable"], errors


def test_an_internal_address_is_refused_before_anything_connects(team, cluster):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    internal = cluster.ports[0][1]
    for url, why in [(f"http://127.0.0.1:{internal}/internal/v1/workers", "loopback"),
                     ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
                     (f"http://localhost:{port}/mcp", "loopback"),
                     (f"http://[::ffff:127.0.0.1]:{port}/mcp", "IPv4 embedded"),
                     ("file:///etc/passwd", "scheme")]:
        tool = {"type": "mcp", "server_url": url, "credential": SECRET}
        with pytest.raises(urllib.error.HTTPError) as refused:
            team.run("openai/gpt-test", "remote-refused", [{"text": "x"}], tools=[tool])
        status, code, message = error_of(refused)
        assert (status, code) == (422, "server_url_refused"), (url, message)
        assert why in message and SECRET not in message, (url, message)
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    # The gateway is unharmed.
    assert team.call("GET", "/v1/agent-runs")["agent_runs"] is not None
