"""The Python SDK's scenario table against real gateways and a real worker: the same
scenarios through the synchronous and the asynchronous client."""

import asyncio
import io
import tarfile
import time

import pytest

from sandbase import (
    AsyncSandbase, AsyncSandbox, InsufficientCredits, NotFound, RateLimited, Sandbase, Sandbox,
)


def test_sync_scenarios(cluster, tmp_path):
    client = Sandbase(cluster.key(), cluster.url)
    with Sandbox.create(template="base", timeout=300, metadata={"suite": "sdk"}, client=client) as sbx:
        # exec, whole and streamed
        result = sbx.commands.run("echo hi && python3 -c 'print(6*7)'")
        assert (result.exit_code, result.stdout) == (0, "hi\n42\n")
        assert sbx.commands.run(["sh", "-c", "exit 3"]).exit_code == 3
        events = list(sbx.commands.stream("for i in 1 2 3; do echo $i; sleep 0.1; done"))
        assert events[0].kind == "pid"
        assert "".join(e.text for e in events if e.kind == "stdout") == "1\n2\n3\n"
        assert events[-1].kind == "exit" and events[-1].exit_code == 0
        # a shell session keeps its directory and variables
        sbx.commands.run("cd /tmp && export A=1", session="main")
        assert sbx.commands.run("pwd; echo $A", session="main").stdout == "/tmp\n1\n"
        # background processes: stdin, signals
        cat = sbx.commands.start(["cat"])
        cat.send_stdin("through stdin\n", close=True)
        done = cat.wait()
        assert (done.exit_code, done.stdout) == (0, "through stdin\n")
        sleeper = sbx.commands.start("sleep 600")
        sleeper.signal("KILL")
        assert not sleeper.wait().running
        assert {p.pid for p in sbx.commands.list()} >= {cat.pid, sleeper.pid}
        # files, upload and download, archives
        sbx.files.write("/work/a.txt", "alpha")
        assert sbx.files.read_text("/work/a.txt") == "alpha"
        local = tmp_path / "up.bin"
        local.write_bytes(bytes(range(256)))
        sbx.files.upload(local, "/work/up.bin")
        assert sbx.files.download("/work/up.bin", tmp_path / "down.bin").read_bytes() == bytes(range(256))
        assert {f.name for f in sbx.files.list("/work")} >= {"a.txt", "up.bin"}
        archive = sbx.files.archive("/work")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            assert any(name.endswith("a.txt") for name in tar.getnames())
        sbx.files.extract("/tmp/copy", archive)
        assert sbx.commands.run("cat /tmp/copy/a.txt").stdout == "alpha"
        sbx.files.remove("/work/up.bin")
        with pytest.raises(NotFound):
            sbx.files.read("/work/up.bin")
        # egress: deny by default, nothing flowed
        assert sbx.egress.flows() == []
        # a terminal: typed into, read back, resized
        terminal = sbx.pty.create(cols=100, rows=30)
        terminal.send("echo pty-$((6*7))\n")
        seen = b""
        for chunk in terminal.attach():
            seen += chunk
            if b"pty-42" in seen:
                break
        terminal.resize(120, 40)
        assert (terminal.refresh().cols, terminal.info.rows) == (120, 40)
        terminal.close()
        # extend, snapshot, restore
        before = sbx.info.expires_at
        assert sbx.extend(900).expires_at > before
        snapshot = sbx.snapshot()
        with Sandbox.create(snapshot=str(snapshot.id), client=client) as restored:
            assert restored.files.read_text("/work/a.txt") == "alpha"
    assert Sandbox.connect(sbx.id, client=client).info.state == "stopped"


CURL = "curl -sS --max-time 10"


def flows_until(read, wanted):
    """The sandbox's flow log once it holds `wanted` (host, decision) pairs, in that order
    (the worker reports flows a moment after they end)."""
    deadline = time.time() + 20
    while True:
        flows = read()
        seen = [(f.host, f.decision) for f in flows]
        if seen == wanted or time.time() > deadline:
            assert seen == wanted, seen
            return flows


def test_sync_egress_policy_credentials_and_flows(cluster):
    client = Sandbase(cluster.key(), cluster.url)
    token = cluster.upstream.token
    client.set_secret("api-token", token, ["api.test.example"])
    with Sandbox.create(template="base", egress=["api.test.example"], credentials=["api-token"],
                        timeout=120, client=client) as sbx:
        assert sbx.egress.policy().allow == ["api.test.example"]
        # An allowed host over HTTPS: the proxy adds the credential the sandbox never holds.
        assert sbx.commands.run(f"{CURL} https://api.test.example/whoami").stdout == "hello\n"
        assert token not in sbx.commands.run("env; cat /proc/self/environ").stdout
        # Another host is refused (deny by default) until the policy names it.
        refused = sbx.commands.run(f"{CURL} -o /dev/null -w '%{{http_code}}' http://other.test.example/x")
        assert refused.stdout == "403"
        assert sbx.egress.set_policy(["api.test.example", "other.test.example"]).allow == [
            "api.test.example", "other.test.example"]
        assert sbx.commands.run(f"{CURL} http://other.test.example/x").stdout == "GET /x HTTP/1.1\n"
        # A name allowed by the policy but pinned to the node's loopback: the SSRF guard
        # refuses it all the same, naming the kind of address only.
        sbx.egress.set_policy(["loopback.test.example"])
        pinned = sbx.commands.run(f"{CURL} -w ' %{{http_code}}' http://loopback.test.example/")
        assert pinned.stdout.endswith(" 403") and "127.0.0.1" not in pinned.stdout, pinned.stdout
        flows = flows_until(sbx.egress.flows, [("api.test.example", "injected"),
                                               ("other.test.example", "denied"),
                                               ("other.test.example", "allowed"),
                                               ("loopback.test.example", "denied")])
        assert flows[0].credentials == ["api-token"] and flows[0].bytes_down > 0
        assert flows[1].reason and "loopback" in (flows[3].reason or "")
    assert "GET /whoami HTTP/1.1" in cluster.upstream.requests()
    assert "GET /x HTTP/1.1" in cluster.upstream.requests()


def test_sync_team_resources(cluster):
    client = Sandbase(cluster.key(), cluster.url)
    assert client.me().role == "owner"
    made = client.create_key("ci", max_credits="1")
    assert made.token.startswith("sb_")
    assert made.name in {k.name for k in client.keys()}
    client.revoke_key(str(made.id))
    assert made.name not in {k.name for k in client.keys()}
    assert len(client.members()) == 1
    assert client.balance().available_micro > 0
    assert client.ledger(limit=5).transactions
    assert client.usage(group_by="kind").group_by == "kind"
    secret = client.set_secret("github", "ghp_value", ["api.github.com"])
    assert secret.name == "github" and "ghp_value" not in secret.model_dump_json()
    assert client.audit(action="secret.*").items
    assert client.store_models() == []
    run = client.run("echo from-run", template="base")
    deadline = time.time() + 120
    while run.state not in ("completed", "failed") and time.time() < deadline:
        time.sleep(0.5)
        run = client.get_run(str(run.id))
    assert (run.state, run.stdout) == ("completed", "from-run\n")


def test_sync_errors_402_and_429(cluster):
    key = cluster.strict_key()
    broke = Sandbase(key, cluster.strict_url, max_retries=0)
    time.sleep(1.1)
    with pytest.raises(InsufficientCredits) as refused:
        Sandbox.create(template="base", client=broke)
    assert refused.value.status == 402 and refused.value.code == "insufficient_credits"
    with pytest.raises(RateLimited) as limited:
        for _ in range(5):
            broke.me()
    assert limited.value.status == 429 and limited.value.retry_after and limited.value.retry_after > 0
    # With retries the SDK waits as told and gets through.
    patient = Sandbase(key, cluster.strict_url, max_retries=5)
    for _ in range(3):
        assert patient.me().role == "owner"


def test_async_scenarios(cluster):
    async def scenario():
        async with AsyncSandbase(cluster.key(), cluster.url) as client:
            sbx = await AsyncSandbox.create(template="base", timeout=300, client=client)
            async with sbx:
                result = await sbx.commands.run("echo hi")
                assert (result.exit_code, result.stdout) == (0, "hi\n")
                streamed = [e async for e in sbx.commands.stream("echo a; echo b >&2")]
                assert "".join(e.text for e in streamed if e.kind == "stdout") == "a\n"
                assert "".join(e.text for e in streamed if e.kind == "stderr") == "b\n"
                cat = await sbx.commands.start(["cat"])
                await cat.send_stdin("async stdin\n", close=True)
                assert (await cat.wait()).stdout == "async stdin\n"
                sleeper = await sbx.commands.start("sleep 600")
                await sleeper.signal("TERM")
                assert not (await sleeper.wait()).running
                await sbx.files.write("/work/b.txt", b"beta")
                assert await sbx.files.read("/work/b.txt") == b"beta"
                archive = await sbx.files.archive("/work")
                await sbx.files.extract("/tmp/copy", archive)
                assert (await sbx.commands.run("cat /tmp/copy/b.txt")).stdout == "beta"
                assert await sbx.egress.flows() == []
                terminal = await sbx.pty.create()
                await terminal.send("echo apty-$((7*6))\n")
                seen = b""
                async for chunk in terminal.attach():
                    seen += chunk
                    if b"apty-42" in seen:
                        break
                await terminal.resize(90, 20)
                assert (await terminal.refresh()).cols == 90
                await terminal.close()
                snapshot = await sbx.snapshot()
                restored = await AsyncSandbox.create(snapshot=str(snapshot.id), client=client)
                async with restored:
                    assert await restored.files.read_text("/work/b.txt") == "beta"
            assert (await AsyncSandbox.connect(sbx.id, client=client)).info.state == "stopped"
            assert (await client.balance()).available_micro > 0

    asyncio.run(scenario())


def test_sync_code_named_commands_and_root(cluster):
    client = Sandbase(cluster.key(), cluster.url)
    with Sandbox.create(template="base", timeout=300, client=client) as sbx:
        # The code endpoint: state between calls, output, the last expression, exceptions
        # as results, an interrupt that keeps the context.
        first = sbx.code.run("import math\nx = 41\nprint('hi')")
        assert (first.stdout, first.main, first.exception) == ("hi\n", None, None)
        assert sbx.code.run("x + 1").main == {"text/plain": "42"}
        failed = sbx.code.run("1 / 0")
        assert failed.exception is not None and failed.exception.name == "ZeroDivisionError"
        slow = sbx.code.run("import time\ny = 'kept'\ntime.sleep(30)", timeout=1)
        assert slow.timed_out and slow.exception.name == "KeyboardInterrupt"
        assert sbx.code.run("y").main == {"text/plain": "'kept'"}
        events = list(sbx.code.stream("print('a')\n6 * 7"))
        # Output may come in several chunks; then the result, then done.
        assert "".join(e.text for e in events if e.kind == "stdout") == "a\n", events
        assert [e.kind for e in events if e.kind != "stdout"] == ["result", "done"], events
        result = next(e for e in events if e.kind == "result")
        assert result.main and result.data["text/plain"] == "42"
        other = sbx.code.create_context(cwd="/tmp")
        assert sbx.code.run("import os\nos.getcwd()", context=other.id).main == {"text/plain": "'/tmp'"}
        assert sorted(c.id for c in sbx.code.contexts()) == sorted(["default", other.id])
        sbx.code.delete_context(other.id)
        with pytest.raises(NotFound):
            sbx.code.run("1", context=other.id)
        # A named command is cancelled by its name; a command runs as root when asked.
        events = sbx.commands.stream("echo begun; sleep 600", exec_id="sdk-sleeper")
        assert next(events).kind == "pid" and next(events).text == "begun\n"
        sbx.commands.cancel("sdk-sleeper")
        assert [e for e in events if e.kind == "exit"][0].exit_code != 0
        assert sbx.commands.run("id -un", user="root").stdout == "root\n"
        # A command longer than the client's own timeout is waited for.
        patient = Sandbox.connect(sbx.id, client=Sandbase(client._http.settings.api_key, cluster.url, timeout=1))
        assert patient.commands.run("sleep 2; echo waited", timeout=10).stdout == "waited\n"


def test_async_code(cluster):
    async def scenario():
        async with AsyncSandbase(cluster.key(), cluster.url) as client:
            async with await AsyncSandbox.create(template="base", timeout=300, client=client) as sbx:
                await sbx.code.run("z = 6")
                assert (await sbx.code.run("z * 7")).main == {"text/plain": "42"}
                events = [e async for e in sbx.code.stream("print(z)")]
                assert "".join(e.text for e in events if e.kind == "stdout") == "6\n", events
                assert events[-1].kind == "done", events
                assert [c.id for c in await sbx.code.contexts()] == ["default"]

    asyncio.run(scenario())


def test_async_egress_policy_credentials_and_flows(cluster):
    async def scenario():
        async with AsyncSandbase(cluster.key(), cluster.url) as client:
            await client.set_secret("api-token", cluster.upstream.token, ["api.test.example"])
            sbx = await AsyncSandbox.create(template="base", egress=["api.test.example"],
                                            credentials=["api-token"], timeout=120, client=client)
            async with sbx:
                whoami = await sbx.commands.run(f"{CURL} https://api.test.example/whoami")
                assert whoami.stdout == "hello\n"
                # HTTPS to a host not allowed: the proxy refuses the tunnel itself.
                refused = await sbx.commands.run(
                    f"{CURL} -o /dev/null -w '%{{http_connect}}' https://other.test.example/x")
                assert refused.stdout == "403"
                await sbx.egress.set_policy(["other.test.example"])
                assert (await sbx.egress.policy()).allow == ["other.test.example"]
                denied = await sbx.commands.run(f"{CURL} -o /dev/null -w '%{{http_code}}' http://api.test.example/")
                assert denied.stdout == "403"
                flows = []
                deadline = time.time() + 20
                while len(flows) < 3 and time.time() < deadline:
                    flows = await sbx.egress.flows()
                    await asyncio.sleep(0.2)
                assert [(f.host, f.decision) for f in flows] == [
                    ("api.test.example", "injected"), ("other.test.example", "denied"),
                    ("api.test.example", "denied")]

    asyncio.run(scenario())


def test_async_errors_402_and_429(cluster):
    async def scenario():
        key = cluster.strict_key()
        await asyncio.sleep(1.1)
        async with AsyncSandbase(key, cluster.strict_url, max_retries=0) as broke:
            with pytest.raises(InsufficientCredits):
                await AsyncSandbox.create(template="base", client=broke)
            with pytest.raises(RateLimited):
                for _ in range(5):
                    await broke.me()
        async with AsyncSandbase(key, cluster.strict_url, max_retries=5) as patient:
            for _ in range(3):
                assert (await patient.me()).role == "owner"

    asyncio.run(scenario())
