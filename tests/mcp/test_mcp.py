"""SandBase's MCP server driven by the official `mcp` client package: over Streamable HTTP
(the stateless 2026-07-28 revision and the 2025-11-25 handshake), over stdio against
`sandbase mcp`, and across two gateways — against real sandboxes on a real worker."""

import base64
import itertools
import json
import os
import urllib.error

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.support.api import call
from tests.support.gateways import BINARY

MODES = ["2026-07-28", "legacy"]
TOOLS = {"sandbox_create", "sandbox_list", "sandbox_extend", "sandbox_destroy", "exec",
         "run_code", "files_read", "files_write", "files_list", "egress_flows",
         "credits_balance"}


def client(url, token, mode, transport=None):
    http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=120,
                              transport=transport)
    return Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode)


def structured(result):
    assert not result.is_error, result
    return result.structured_content


async def create(session):
    return structured(await session.call_tool("sandbox_create", {}))["id"]


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_drives_a_sandbox_through_mcp(cluster, mode):
    token = cluster.signup()

    async def scenario():
        async with client(cluster.urls[0], token, mode) as session:
            listed = await session.list_tools()
            names = {tool.name for tool in listed.tools}
            assert TOOLS <= names, names
            # No store configured: no store tool. Descriptions are fixed text.
            assert "store_models" not in names
            exec_tool = next(tool for tool in listed.tools if tool.name == "exec")
            assert exec_tool.input_schema["required"] == ["sandbox_id"]
            assert next(t for t in listed.tools if t.name == "sandbox_destroy").annotations.destructive_hint
            sandbox = await create(session)
            ran = structured(await session.call_tool(
                "exec", {"sandbox_id": sandbox, "command": "python3 -c 'print(6*7)'"}))
            assert ran["exit_code"] == 0 and ran["stdout"] == "42\n", ran
            payload = bytes(range(256)) * 4
            encoded = base64.b64encode(payload).decode()
            structured(await session.call_tool("files_write", {
                "sandbox_id": sandbox, "path": "/work/blob.bin", "content": encoded,
                "encoding": "base64"}))
            read = structured(await session.call_tool(
                "files_read", {"sandbox_id": sandbox, "path": "/work/blob.bin"}))
            assert read["encoding"] == "base64" and base64.b64decode(read["content"]) == payload
            listing = structured(await session.call_tool(
                "files_list", {"sandbox_id": sandbox, "path": "/work"}))
            assert any(entry["name"] == "blob.bin" for entry in listing["entries"])
            # Long output comes back capped, with a marker.
            flood = structured(await session.call_tool(
                "exec", {"sandbox_id": sandbox, "argv": ["python3", "-c", "print('x' * 100000)"]}))
            assert "output truncated" in flood["stdout"]
            # A long command reports progress to a client that asks for it.
            progress = []

            async def on_progress(value, total, message):
                progress.append((value, message))

            slow = structured(await session.call_tool(
                "exec", {"sandbox_id": sandbox, "command": "sleep 2.5; echo done"},
                progress_callback=on_progress))
            assert slow["stdout"] == "done\n"
            assert [value for value, _ in progress] == [1, 2], progress
            assert progress[0][1] == "running for 1 s"
            # run_code without a sandbox makes one and says which.
            code = structured(await session.call_tool(
                "run_code", {"language": "python", "code": "print(sum(range(10)))"}))
            assert code["stdout"] == "45\n" and code["sandbox_id"]
            for doomed in (sandbox, code["sandbox_id"]):
                structured(await session.call_tool("sandbox_destroy", {"sandbox_id": doomed}))
            gone = call(cluster.urls[0], "GET", f"/v1/sandboxes/{sandbox}", token)
            assert gone["state"] == "stopped"
            assert not any(sandbox in container for container in cluster.containers())
            balance = structured(await session.call_tool("credits_balance", {}))
            assert balance["available_micro"] > 0

    anyio.run(scenario)


def resident_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) // 1024


def test_one_files_read_cannot_swell_the_gateway(cluster):
    """files_read of an endless device, of a FIFO nobody writes and of a file larger than the
    cap: each a clear tool error, at once, and the gateway stays within a few MiB of where it
    was (reading /dev/zero used to grow it by 2 GiB in seconds). The REST download of a
    character device is refused the same way."""
    token = cluster.signup()
    pid = cluster.gateway_pids[0]

    async def scenario():
        async with client(cluster.urls[0], token, MODES[0]) as session:
            sandbox = await create(session)
            structured(await session.call_tool("exec", {
                "sandbox_id": sandbox,
                "command": "mkfifo /work/pipe && head -c 20000000 /dev/zero > /work/big.bin"}))
            before = resident_mib(pid)
            started = anyio.current_time()
            for path, code in (("/dev/zero", "invalid_request"), ("/dev/urandom", "invalid_request"),
                               ("/work/pipe", "invalid_request"), ("/work/big.bin", "file_too_large")):
                result = await session.call_tool("files_read", {"sandbox_id": sandbox, "path": path})
                assert result.is_error, (path, result)
                assert result.structured_content["error"]["code"] == code, (path, result)
            assert anyio.current_time() - started < 30
            grown = resident_mib(pid) - before
            assert grown < 96, f"the gateway grew by {grown} MiB"
            with pytest.raises(urllib.error.HTTPError) as raised:
                call(cluster.urls[0], "GET", f"/v1/sandboxes/{sandbox}/files?path=/dev/zero", token)
            assert raised.value.code == 422
            refused = json.loads(raised.value.read())
            assert refused["error"]["code"] == "invalid_request"
            assert "character device" in refused["error"]["message"]
            structured(await session.call_tool("sandbox_destroy", {"sandbox_id": sandbox}))

    anyio.run(scenario)


def test_no_key_no_tools_and_foreign_origins_are_refused(cluster):
    token = cluster.signup()
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"accept": "application/json, text/event-stream",
               "content-type": "application/json"}
    answer = httpx2.post(f"{cluster.urls[0]}/mcp", json=initialize, headers=headers)
    assert answer.status_code == 401, answer.text
    assert "sandbox_create" not in answer.text
    assert answer.json()["error"]["code"] == "unauthenticated"
    # No OAuth is advertised (a client that found metadata would drop its bearer header).
    assert "resource_metadata" not in answer.headers.get("www-authenticate", "")
    for path in ("/.well-known/oauth-protected-resource/mcp",
                 "/.well-known/oauth-authorization-server"):
        assert httpx2.get(f"{cluster.urls[0]}{path}").status_code == 404
    wrong = httpx2.post(f"{cluster.urls[0]}/mcp", json=initialize,
                        headers={**headers, "authorization": "Bearer sb_nope_nope"})
    assert wrong.status_code == 401
    foreign = httpx2.post(f"{cluster.urls[0]}/mcp", json=initialize,
                          headers={**headers, "authorization": f"Bearer {token}",
                                   "origin": "https://evil.example"})
    assert foreign.status_code == 403, foreign.text
    assert "sandbox_create" not in foreign.text


def test_another_teams_sandbox_is_not_found_and_untouched(cluster):
    alice, mallory = cluster.signup(), cluster.signup()

    async def scenario():
        async with client(cluster.urls[0], alice, "2026-07-28") as session:
            sandbox = await create(session)
            structured(await session.call_tool("files_write", {
                "sandbox_id": sandbox, "path": "/work/secret.txt", "content": "alice's"}))
        async with client(cluster.urls[0], mallory, "2026-07-28") as session:
            for tool, arguments in [
                ("exec", {"sandbox_id": sandbox, "command": "rm -rf /work"}),
                ("files_write", {"sandbox_id": sandbox, "path": "/work/secret.txt",
                                 "content": "mallory's"}),
                ("files_read", {"sandbox_id": sandbox, "path": "/work/secret.txt"}),
                ("sandbox_destroy", {"sandbox_id": sandbox}),
            ]:
                result = await session.call_tool(tool, arguments)
                assert result.is_error, (tool, result)
                assert result.structured_content["error"]["code"] == "not_found"
            # A malformed id never becomes part of a path.
            bad = await session.call_tool("files_read", {"sandbox_id": "../../v1/api-keys",
                                                         "path": "/"})
            assert bad.is_error and bad.structured_content["error"]["code"] == "invalid_request"
        async with client(cluster.urls[0], alice, "2026-07-28") as session:
            read = structured(await session.call_tool(
                "files_read", {"sandbox_id": sandbox, "path": "/work/secret.txt"}))
            assert read["content"] == "alice's"
            structured(await session.call_tool("sandbox_destroy", {"sandbox_id": sandbox}))

    anyio.run(scenario)


def test_a_team_out_of_credits_gets_a_tool_error(cluster):
    # The second gateway gives new teams nothing.
    broke = cluster.signup(gateway=1)

    async def scenario():
        async with client(cluster.urls[1], broke, "2026-07-28") as session:
            result = await session.call_tool("run_code", {"language": "bash", "code": "true"})
            assert result.is_error
            assert result.structured_content["error"]["code"] == "insufficient_credits"
            assert "insufficient_credits" in result.content[0].text

    anyio.run(scenario)


def test_the_stdio_server_uses_the_clis_key(cluster):
    token = cluster.signup()
    parameters = StdioServerParameters(
        command=BINARY, args=["mcp"],
        env={"PATH": os.environ.get("PATH", ""), "SANDBASE_URL": cluster.urls[0],
             "SANDBASE_API_KEY": token, "HOME": os.environ.get("HOME", "/root")})

    async def scenario():
        async with Client(parameters, mode="legacy") as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert TOOLS <= names
            code = structured(await session.call_tool(
                "run_code", {"language": "python", "code": "print(6*7)"}))
            assert code["stdout"] == "42\n"
            structured(await session.call_tool("sandbox_destroy",
                                               {"sandbox_id": code["sandbox_id"]}))

    anyio.run(scenario)


class Alternating(httpx2.AsyncBaseTransport):
    """Sends each request to the next gateway in turn (one conversation, two replicas)."""

    def __init__(self, urls):
        self.ports = itertools.cycle([httpx2.URL(url).port for url in urls])
        self.inner = httpx2.AsyncHTTPTransport()
        self.seen = []

    async def handle_async_request(self, request):
        port = next(self.ports)
        self.seen.append(port)
        request.url = request.url.copy_with(port=port)
        return await self.inner.handle_async_request(request)


@pytest.mark.parametrize("mode", MODES)
def test_two_gateways_serve_one_conversation(cluster, mode):
    token = cluster.signup()
    transport = Alternating(cluster.urls)

    async def scenario():
        async with client(cluster.urls[0], token, mode, transport) as session:
            sandbox = await create(session)
            for n in range(4):
                ran = structured(await session.call_tool(
                    "exec", {"sandbox_id": sandbox, "command": f"echo {n}"}))
                assert ran["stdout"] == f"{n}\n"
            structured(await session.call_tool("sandbox_destroy", {"sandbox_id": sandbox}))

    anyio.run(scenario)
    assert len(set(transport.seen)) == 2, transport.seen


def test_the_operators_mcp_server_is_reached_with_its_credential_and_billed_once(cluster):
    token = cluster.signup()
    before = call(cluster.urls[0], "GET", "/v1/billing/balance", token)["available_micro"]

    async def scenario():
        async with client(cluster.urls[0], token, "2026-07-28") as session:
            listed = (await session.list_tools()).tools
            names = {tool.name for tool in listed}
            assert {"upstream.echo", "upstream.nap"} <= names, names
            # A third party's words reach every tenant's model: marked as such, and capped.
            echo = next(tool for tool in listed if tool.name == "upstream.echo")
            assert echo.description.startswith("[Third-party tool of the MCP server `upstream`")
            # The team sends its SandBase key only; the upstream requires its own credential.
            result = await session.call_tool("upstream.echo", {"text": "hello"})
            assert not result.is_error, result
            assert result.content[0].text == "upstream heard: hello"
            # Slower than the server's 2 s: a tool error, not a hung client, and not billed.
            started = anyio.current_time()
            slow = await session.call_tool("upstream.nap", {"seconds": 5})
            assert slow.is_error
            assert slow.structured_content["error"]["code"] == "upstream_timeout"
            assert anyio.current_time() - started < 4.5

    anyio.run(scenario)
    with open(cluster.upstream_calls) as handle:
        assert handle.read().splitlines() == ["echo"]
    after = call(cluster.urls[0], "GET", "/v1/billing/balance", token)["available_micro"]
    assert before - after == 50_000, (before, after)
    requests = call(cluster.urls[0], "GET", "/v1/store/requests", token)
    assert [(r["name"], r["credits_micro"]) for r in requests["requests"]] == [("upstream", 50_000)]
    audit = call(cluster.urls[0], "GET", "/v1/audit?action=mcp.tool_call", token)
    outcomes = sorted(event["outcome"] for event in audit["items"])
    assert outcomes == ["failure", "success"], audit
