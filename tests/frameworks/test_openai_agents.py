"""The OpenAI Agents SDK (the real package, pinned in openai-agents.txt) with SandBase as its
sandbox client (`sandbase.integrations.openai_agents`): a `SandboxAgent` whose model is the
store's `openai/gpt-test` (the shared stand-in, scripted) runs a shell task in a SandBase
sandbox; a session's workspace round-trips through persist and hydrate into another sandbox
when it is resumed; interactive processes with and without a TTY; the run-as users; and
the sandbox is gone after — also when the process that made it is killed."""

import asyncio
import io
import json
import uuid

import pytest
from agents import Runner, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel
from agents.run import RunConfig
from agents.sandbox import LocalSnapshotSpec, SandboxAgent, SandboxRunConfig
from agents.sandbox.capabilities import Filesystem, Shell
from agents.sandbox.errors import WorkspaceReadNotFoundError
from openai import AsyncOpenAI

from sandbase import AsyncSandbase
from sandbase.integrations.openai_agents import (
    SandbaseSandboxClient, SandbaseSandboxClientOptions, SandbaseSandboxSession)

# The store's model the stand-in plays (tests/frameworks/conftest.py).
MODEL = "openai/gpt-test"
set_tracing_disabled(True)


def client_for(cluster, key):
    return SandbaseSandboxClient(client=AsyncSandbase(api_key=key, base_url=cluster.url))


def test_a_sandbox_agent_runs_a_shell_task_in_a_sandbase_sandbox(cluster, sandbase_env):
    script = f"agents-{uuid.uuid4().hex[:8]}"
    command = "echo hello > note.txt && cat note.txt && whoami && pwd && echo $GREETING"
    cluster.standin.script(script, [
        {"tool": "exec_command", "arguments": {"cmd": command, "yield_time_ms": 10000}},
        {"text": "done: the note says hello"},
    ])
    model = OpenAIResponsesModel(model=MODEL, openai_client=AsyncOpenAI(
        base_url=f"{cluster.url}/openai/v1", api_key=sandbase_env, max_retries=0))
    # Not the default Compaction capability: the store does not pass `context_management` on.
    agent = SandboxAgent(name="builder", instructions="Use the shell.", model=model,
                         capabilities=[Filesystem(), Shell()])
    options = SandbaseSandboxClientOptions(env={"GREETING": "from the spec"})
    config = RunConfig(sandbox=SandboxRunConfig(client=client_for(cluster, sandbase_env), options=options))

    async def run():
        return await Runner.run(agent, f"[[script:{script}]] write a note", run_config=config, max_turns=4)

    result = asyncio.run(run())
    assert result.final_output == "done: the note says hello"
    # What the model was sent back: the command's output, from inside the sandbox.
    sent = cluster.standin.requests(f"[[script:{script}]]")
    assert len(sent) == 2, [request["path"] for request in sent]
    outputs = [item for item in sent[1]["body"]["input"]
               if isinstance(item, dict) and item.get("type") == "function_call_output"]
    assert len(outputs) == 1, sent[1]["body"]["input"]
    assert "hello\nuser\n/work\nfrom the spec" in json.dumps(outputs[0]["output"]).replace("\\n", "\n")
    assert "Process exited with code 0" in str(outputs[0]["output"]), outputs[0]
    # The run's sandbox is gone, and it was the adapter's (its metadata says so).
    assert cluster.sandboxes(sandbase_env, "running") == []
    made = cluster.sandboxes(sandbase_env)
    assert [sandbox["metadata"] for sandbox in made] == [{"framework": "openai-agents"}]


def test_a_workspace_round_trips_through_persist_and_hydrate_on_resume(cluster, sandbase_env, tmp_path):
    client = client_for(cluster, sandbase_env)

    async def scenario():
        session = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path),
                                      options=SandbaseSandboxClientOptions())
        first = session._inner.state.sandbox_id
        async with session:
            done = await session.exec("mkdir -p data && echo kept > data/a.txt && id -un")
            assert done.exit_code == 0 and done.stdout == b"user\n", done.stdout
            await session.write("data/b.bin", io.BytesIO(bytes(range(256))))
            payload = client.serialize_session_state(session.state)
        # Closed: its workspace persisted to the local snapshot, its sandbox destroyed.
        assert (tmp_path / f"{session.state.snapshot.id}.tar").is_file()
        assert cluster.sandboxes(sandbase_env, "running") == []
        resumed = await client.resume(client.deserialize_session_state(json.loads(json.dumps(payload))))
        async with resumed:
            assert resumed._inner.state.sandbox_id != first
            assert (await resumed.read("data/a.txt")).read() == b"kept\n"
            assert (await resumed.read("data/b.bin")).read() == bytes(range(256))
            with pytest.raises(WorkspaceReadNotFoundError):
                await resumed.read("data/missing.txt")
            # A path outside the workspace is refused before anything is read.
            with pytest.raises(Exception):
                await resumed.read("../../etc/shadow")
        await client.close()

    asyncio.run(scenario())
    assert cluster.sandboxes(sandbase_env, "running") == []


def test_interactive_processes_and_users(cluster, sandbase_env):
    client = client_for(cluster, sandbase_env)

    async def scenario():
        session = await client.create(options=SandbaseSandboxClientOptions())
        inner = session._inner
        assert isinstance(inner, SandbaseSandboxSession)
        async with session:
            # A TTY: a terminal session the model types into.
            started = await inner.pty_exec_start("cat", shell=False, tty=True, yield_time_s=0.5)
            assert started.process_id is not None and started.exit_code is None
            echoed = await inner.pty_write_stdin(session_id=started.process_id, chars="ping\n",
                                                 yield_time_s=1)
            assert b"ping" in echoed.output, echoed.output
            ended = await inner.pty_write_stdin(session_id=started.process_id, chars="\x04",
                                                yield_time_s=5)
            assert ended.process_id is None and ended.exit_code == 0, ended
            # Without a TTY: a named command, its output as it comes, then its exit.
            quick = await inner.pty_exec_start("echo one; sleep 0.3; echo two; exit 3", yield_time_s=5)
            assert quick.output == b"one\ntwo\n" and quick.exit_code == 3, quick
            slow = await inner.pty_exec_start("echo begun; sleep 600", yield_time_s=0.5)
            assert slow.process_id is not None and b"begun" in slow.output, slow
            await inner.pty_terminate_all()
            left = await session.exec("pgrep -f 'sleep 600' || echo none")
            assert left.stdout == b"none\n", left.stdout
            # Commands run as the sandbox's user, or as root when asked; no other user.
            assert (await session.exec("id -un", user="root")).stdout == b"root\n"
            with pytest.raises(ValueError):
                await session.exec("id -un", user="nobody")
        await client.close()

    asyncio.run(scenario())
    assert cluster.sandboxes(sandbase_env, "running") == []


def test_the_isolation_level_comes_from_the_sandbox_spec(cluster, sandbase_env):
    client = client_for(cluster, sandbase_env)

    async def scenario():
        session = await client.create(options=SandbaseSandboxClientOptions(isolation="gvisor"))
        async with session:
            assert session._inner.sandbox.info.isolation == "gvisor"
            assert (await session.exec("echo ok")).stdout == b"ok\n"
        await client.close()

    asyncio.run(scenario())
    assert cluster.sandboxes(sandbase_env, "running") == []


KILLED = """
import asyncio, sys, time
from sandbase.integrations.openai_agents import SandbaseSandboxClient, SandbaseSandboxClientOptions

async def main():
    client = SandbaseSandboxClient()
    session = await client.create(options=SandbaseSandboxClientOptions(timeout_secs=int(sys.argv[1])))
    await session.start()
    print("SANDBOX", session._inner.state.sandbox_id, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_a_killed_process_leaves_no_sandbox_after_the_expiry_it_set(cluster, sandbase_env):
    cluster.killed_leaves_nothing(sandbase_env, KILLED)
