"""Agent runs through the Python SDK (`client.agent_runs`, sync and async) on the harness's
cluster: create, events followed live through a gateway killed and started again (the
iterators resume by themselves from the last event they yielded, each `seq` once), inputs,
approvals, cancel, the ledger, and errors as the SDK's exceptions."""

import asyncio
import signal
import threading
import time
import uuid

import pytest

from sandbase import AsyncSandbase, NotFound, Sandbase
from tests.harness.conftest import Team

MODEL = "openai/gpt-test"


def follow_sync(client, run_id, seen, done):
    for event in client.agent_runs.events(run_id):
        seen.append(event)
    done.set()


def follow_async(url, token, run_id, seen, done):
    async def follow():
        async with AsyncSandbase(token, url) as client:
            async for event in client.agent_runs.events(run_id):
                seen.append(event)

    asyncio.run(follow())
    done.set()


def test_the_sdks_event_iterators_resume_through_a_killed_gateway(team, cluster):
    client = Sandbase(team.token, cluster.urls[0])
    script = f"sdk-{uuid.uuid4().hex[:8]}"
    cluster.standin.script(script, [
        {"tool": "shell", "arguments": {"command": "sleep 3; echo slept"}}, {"text": "done"}])
    run = client.agent_runs.create(model=MODEL, input=f"[[script:{script}]] go", tools=[{"type": "shell"}],
                                   idempotency_key=script)
    assert client.agent_runs.create(model=MODEL, input=f"[[script:{script}]] go", tools=[{"type": "shell"}],
                                    idempotency_key=script).id == run.id
    run_id = str(run.id)
    synced, asynced = [], []
    sync_done, async_done = threading.Event(), threading.Event()
    threads = [threading.Thread(target=follow_sync, args=(client, run_id, synced, sync_done)),
               threading.Thread(target=follow_async,
                                args=(cluster.urls[0], team.token, run_id, asynced, async_done))]
    for thread in threads:
        thread.start()
    try:
        deadline = time.time() + 60
        while not (any(e.type == "tool.called" for e in synced) and any(e.type == "tool.called" for e in asynced)):
            assert time.time() < deadline, (synced, asynced)
            time.sleep(0.05)
        # Killed mid-iteration, while the command runs; started again a moment later.
        cluster.signal_gateway(0, signal.SIGKILL)
        time.sleep(1)
        cluster.restart_gateway(0)
        idle = client.agent_runs.wait(run_id, timeout=120)
        assert idle.status == "idle", idle
        # The run ends: both streams end with it.
        assert client.agent_runs.cancel(run_id).id == run.id
        assert sync_done.wait(60) and async_done.wait(60)
    finally:
        for thread in threads:
            thread.join(timeout=60)
    journal = list(client.agent_runs.events(run_id, follow=False))
    seqs = [event.seq for event in journal]
    assert seqs == list(range(1, len(seqs) + 1))
    assert [event.seq for event in synced] == seqs
    assert [event.seq for event in asynced] == seqs
    assert journal[-1].type == "run.status" and journal[-1].data["status"] == "cancelled"
    steps = client.agent_runs.steps(run_id)
    assert [step.kind for step in steps] == ["model", "tool", "model"], steps
    assert [turn.tool_steps for turn in client.agent_runs.turns(run_id)] == [1]


def test_approvals_messages_and_errors_through_the_sdk(team, cluster):
    async def scenario():
        async with AsyncSandbase(team.token, cluster.urls[1]) as client:
            script = f"sdk-ask-{uuid.uuid4().hex[:8]}"
            cluster.standin.script(script, [
                {"tool": "shell", "arguments": {"command": "echo approved > /work/a.txt"}},
                {"text": "written"}])
            run = await client.agent_runs.create(
                model=MODEL, input=f"[[script:{script}]] go", tools=[{"type": "shell"}],
                approvals=[{"tool": "shell", "match": "^echo", "policy": "ask"}])
            run_id = str(run.id)
            waiting = await client.agent_runs.wait(run_id)
            assert waiting.status == "requires_action", waiting
            action = waiting.required_actions[0]
            assert action.type == "approval", action
            call_id = action.call_id
            await client.agent_runs.approve(run_id, call_id, reason="fine")
            idle = await client.agent_runs.wait(run_id, until=["idle"])
            assert idle.tool_calls == 1
            # A message starts the next turn (the script then says its last step again).
            await client.agent_runs.send(run_id, "and again")
            assert (await client.agent_runs.wait(run_id, until=["idle"])).turns == 2
            assert [r.id for r in await client.agent_runs.list()] == [run.id]
            await client.agent_runs.cancel(run_id)
            with pytest.raises(NotFound):
                await client.agent_runs.get(str(uuid.uuid4()))

    asyncio.run(scenario())
    # Another team's key: not found, and cannot decide.
    other = Sandbase(Team(cluster).token, cluster.urls[0])
    with pytest.raises(NotFound):
        other.agent_runs.get(str(team.call("GET", "/v1/agent-runs")["agent_runs"][0]["id"]))



def test_an_mcp_client_hands_a_task_to_an_agent_run_and_follows_it(team, cluster):
    """The agent-run tools of SandBase's MCP server, driven by the official `mcp` client."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    script = f"sdk-mcp-{uuid.uuid4().hex[:8]}"
    cluster.standin.script(script, [
        {"tool": "shell", "arguments": {"command": "echo from-mcp > /work/m.txt && cat /work/m.txt"}},
        {"text": "wrote m.txt"}])

    async def scenario():
        http = httpx2.AsyncClient(headers={"authorization": f"Bearer {team.token}"}, timeout=120)
        async with Client(streamable_http_client(f"{cluster.urls[1]}/mcp", http_client=http)) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert {"agent_run_create", "agent_run_get", "agent_run_events"} <= names, names
            created = await session.call_tool("agent_run_create", {
                "model": MODEL, "task": f"[[script:{script}]] write m.txt", "tools": ["shell"],
                "max_credits": "0.5"})
            assert not created.is_error, created
            run_id = created.structured_content["id"]
            after, lines, status = 0, [], ""
            deadline = time.time() + 120
            while status != "idle":
                assert time.time() < deadline, lines
                page = await session.call_tool("agent_run_events", {"run_id": run_id, "after": after})
                assert not page.is_error, page
                events = page.structured_content["events"]
                status = page.structured_content["status"]
                after = events[-1]["seq"] if events else after
                lines += page.content[0].text.splitlines()[1:]
                await asyncio.sleep(0.2)
            got = await session.call_tool("agent_run_get", {"run_id": run_id})
            assert "idle, 1 turn(s), 1 tool call(s)" in got.content[0].text, got.content[0].text
            # Another team's run, and a malformed id: clear refusals, nothing else.
            foreign = await session.call_tool("agent_run_get", {"run_id": str(uuid.uuid4())})
            assert foreign.is_error
            malformed = await session.call_tool("agent_run_events", {"run_id": "../sandboxes"})
            assert malformed.is_error and "not an agent run id" in malformed.content[0].text
        return run_id, lines

    run_id, lines = asyncio.run(scenario())
    assert any(" tool.completed " in line and "from-mcp" in line for line in lines), lines
    assert not any(".delta " in line for line in lines), lines
    run = team.call("GET", f"/v1/agent-runs/{run_id}")
    assert run["metadata"] == {"via": "mcp"} and float(run["limits"]["max_credits"]) == 0.5, run
