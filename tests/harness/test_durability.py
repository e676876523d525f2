"""Durability of agent runs across gateways: a gateway killed with SIGKILL during a tool call
(the other adopts the run, the tool ran once, a stream resumed with Last-Event-ID sees every
event once, byte for byte), and a gateway paused past its lease (it writes nothing when it
wakes; every model request was made once)."""

import signal
import time
import urllib.error

from tests.harness.conftest import Sse


def read_until(stream, predicate, frames, deadline=120):
    """Reads frames into `frames` until one's event satisfies `predicate`; True when it did."""
    end = time.time() + deadline
    for raw, event in stream.frames():
        frames.append((raw, event))
        if predicate(event) or time.time() > end:
            return predicate(event)
    return False


def running(team, sandbox, exec_id, deadline=30):
    """Until the sandbox's worker knows the command `exec_id`."""
    end = time.time() + deadline
    while True:
        try:
            return team.call("GET", f"/v1/sandboxes/{sandbox}/execs/{exec_id}")
        except urllib.error.HTTPError as error:
            assert error.code == 404 and time.time() < end, error
            time.sleep(0.05)


def idle(event):
    return event["type"] == "run.status" and event["data"]["status"] == "idle"


def test_a_killed_gateways_run_is_adopted_and_its_tool_runs_once(team, cluster):
    token = team.token
    # Only gateway 0 steps runs while the run starts.
    cluster.restart_gateway(1, HARNESS__MAX_CONCURRENT="0")
    try:
        steps = [{"tool": "shell", "arguments": {"command": "sleep 4; echo x >> /work/.count; echo slept"}},
                 {"text": "done"}]
        run = team.run("openai/gpt-test", "kill", steps)
        stream = Sse(cluster.urls[0], token, run["id"])
        frames = []
        assert read_until(stream, lambda event: event["type"] == "tool.called", frames)
        # Killed once the command runs on the worker (its exec id known there).
        sandbox = next(e["data"]["sandbox_id"] for _, e in frames if e["type"] == "sandbox.ready")
        running(team, sandbox, f"{run['id']}-{frames[-1][1]['data']['step']}")
        cluster.signal_gateway(0, signal.SIGKILL)
        # What was sent before the kill is read to the end of the broken stream.
        read_until(stream, lambda event: False, frames, deadline=5)
        stream.close()
        # Gateway 0 comes back without stepping runs; gateway 1 steps again and adopts.
        cluster.start_gateway(0, HARNESS__MAX_CONCURRENT="0")
        cluster.restart_gateway(1)
        resumed = Sse(cluster.urls[1], token, run["id"], last_event_id=frames[-1][1]["seq"])
        assert read_until(resumed, idle, frames)
        resumed.close()
    finally:
        cluster.restart_gateway(0)
        cluster.restart_gateway(1)
    seqs = [event["seq"] for _, event in frames]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    # The same bytes as a replay from the journal.
    replay = Sse(cluster.urls[0], token, run["id"])
    replayed = []
    read_until(replay, lambda event: event["seq"] == seqs[-1], replayed)
    replay.close()
    assert b"".join(raw for raw, _ in replayed) == b"".join(raw for raw, _ in frames)
    done = team.wait(run["id"], statuses=("idle",))
    assert done["tool_calls"] == 1, done
    ledger = team.call("GET", f"/v1/agent-runs/{run['id']}/steps")["steps"]
    assert team.exec(done["sandbox_id"], "cat /work/.count")["stdout"] == "x\n", ledger
    tool = [step for step in ledger if step["kind"] == "tool"]
    assert len(tool) == 1 and tool[0]["state"] == "completed", ledger
    assert tool[0]["result"]["adopted"] is True, tool
    completed = [event for _, event in frames if event["type"] == "tool.completed"]
    assert len(completed) == 1 and "slept" in completed[0]["data"]["output"], completed


def test_a_paused_owner_writes_nothing_when_it_wakes(team, cluster):
    cluster.restart_gateway(1, HARNESS__MAX_CONCURRENT="0")
    steps = [{"tool": "shell", "arguments": {"command": "sleep 2; echo x >> /work/.count"}},
             {"tool": "shell", "arguments": {"command": "echo y >> /work/.count"}},
             {"text": "both done"}]
    try:
        run = team.run("openai/gpt-test", "pause", steps)
        deadline = time.time() + 60
        while not any(e["type"] == "tool.called" for e in team.events(run["id"])):
            assert time.time() < deadline
            time.sleep(0.05)
        events = team.events(run["id"])
        sandbox = next(e["data"]["sandbox_id"] for e in events if e["type"] == "sandbox.ready")
        step = next(e["data"]["step"] for e in events if e["type"] == "tool.called")
        running(team, sandbox, f"{run['id']}-{step}")
        cluster.restart_gateway(1)
        # Gateway 0 sleeps past its lease (3 s); gateway 1 adopts the run and finishes it.
        cluster.signal_gateway(0, signal.SIGSTOP)
        done = team.wait(run["id"], statuses=("idle",), gateway=1)
        cluster.signal_gateway(0, signal.SIGCONT)
        time.sleep(3)
    finally:
        cluster.signal_gateway(0, signal.SIGCONT)
        cluster.restart_gateway(1)
    after = team.call("GET", f"/v1/agent-runs/{run['id']}")
    assert after["status"] == "idle" and after["last_seq"] == done["last_seq"], after
    ledger = team.call("GET", f"/v1/agent-runs/{run['id']}/steps")["steps"]
    assert [s["kind"] for s in ledger if s["state"] != "interrupted"] == ["model", "tool", "model", "tool", "model"], ledger
    assert team.exec(done["sandbox_id"], "cat /work/.count")["stdout"] == "x\ny\n"
    # The stand-in saw each of the conversation's model requests once.
    seen = [r for r in cluster.standin.requests("[[script:pause]]")]
    results = [sum(1 for m in r["body"]["messages"] if m.get("role") == "tool") for r in seen]
    assert sorted(results) == [0, 1, 2], results


def test_a_call_whose_end_is_unknown_waits_for_a_person_when_asked(team, cluster):
    # A Python call has no exec id a worker keeps: after the owner dies, its end is unknown.
    code = "import time\ntime.sleep(3)\nopen('/work/.py-count', 'a').write('x')\nprint('wrote')"
    steps = [{"tool": "python", "arguments": {"code": code}}, {"text": "written"}]
    cluster.restart_gateway(1, HARNESS__MAX_CONCURRENT="0")
    try:
        run = team.run("openai/gpt-test", "uncertain", steps, on_uncertain_tool="ask")
        deadline = time.time() + 60
        while not any(e["type"] == "tool.called" for e in team.events(run["id"])):
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(1)
        cluster.signal_gateway(0, signal.SIGKILL)
        cluster.start_gateway(0, HARNESS__MAX_CONCURRENT="0")
        cluster.restart_gateway(1)
        waiting = team.wait(run["id"], gateway=1)
    finally:
        cluster.restart_gateway(0)
        cluster.restart_gateway(1)
    assert waiting["status"] == "requires_action", waiting
    (action,) = waiting["required_actions"]
    assert (action["type"], action["tool"], action["uncertain"]) == ("approval", "python", True)
    asked = [e["data"] for e in team.events(run["id"]) if e["type"] == "approval.requested"]
    assert asked and asked[0]["uncertain"] is True, asked
    # Allowed, it runs again: the first run had finished on the worker, so twice in all.
    team.call("POST", f"/v1/agent-runs/{run['id']}/inputs",
              {"type": "approval", "call_id": action["call_id"], "decision": "allow"})
    done = team.wait(run["id"], statuses=("idle", "failed", "completed"))
    assert done["status"] == "idle", done
    assert team.exec(done["sandbox_id"], "cat /work/.py-count")["stdout"] == "xx"
    ledger = team.call("GET", f"/v1/agent-runs/{run['id']}/steps")["steps"]
    states = [(s["kind"], s["state"]) for s in ledger if s["kind"] == "tool"]
    assert states == [("tool", "interrupted"), ("tool", "completed")], ledger
