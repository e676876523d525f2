"""The harness against real gateways, a real worker and real sandboxes, with the scripted
stand-in provider speaking both families' wire formats. Counts of tool executions are taken
inside the sandbox."""

import json
import urllib.error

import pytest

from tests.harness.conftest import MODELS

THREE_TOOLS = [
    {"tool": "shell", "arguments": {"command": "echo x >> /work/.count && mkdir -p /work/out && echo hello > /work/out/a.txt && pwd"}},
    {"tool": "files", "arguments": {"command": "str_replace", "path": "out/a.txt", "old_str": "hello", "new_str": "howdy"}},
    {"tool": "python", "arguments": {"code": "n = open('/work/.count').read().count('x')\nprint('count', n)\nopen('/work/out/a.txt').read().strip()"}},
    {"text": "All three tools ran."},
]


@pytest.mark.parametrize("model", MODELS)
def test_a_three_tool_run_completes_on_each_family(team, model):
    family = model.split("/")[0]
    run = team.run(model, f"three-{family}", THREE_TOOLS, metadata={"case": "three"})
    assert run["status"] == "queued" and run["key_id"], run
    done = team.wait(run["id"])
    assert done["status"] == "idle", done
    assert (done["turns"], done["tool_calls"]) == (1, 3), done
    # Waiting for a message, the run's sandbox is paused (billed as paused).
    assert team.call("GET", f"/v1/sandboxes/{done['sandbox_id']}")["state"] == "paused"
    assert done["usage"]["output_tokens"] > 0 and done["cost_micro"] > 0, done
    events = team.events(run["id"])
    assert [event["seq"] for event in events] == list(range(1, len(events) + 1))
    completed = [event["data"] for event in events if event["type"] == "tool.completed"]
    assert [c["tool"] for c in completed] == ["shell", "files", "python"], completed
    assert not any(c["is_error"] for c in completed), completed
    assert "/work" in completed[0]["output"]
    assert "count 1" in completed[2]["output"] and "howdy" in completed[2]["output"]
    final = [e for e in events if e["type"] == "model.completed"][-1]["data"]
    assert final["message"]["content"][0]["text"] == "All three tools ran."
    # Each answer streamed: its pieces, put together, are the answer's parts.
    for answer in [e["data"] for e in events if e["type"] == "model.completed"]:
        deltas = [e["data"] for e in events
                  if e["type"] == "model.delta" and e["data"]["step"] == answer["step"]]
        for number, part in enumerate(answer["message"]["content"]):
            pieces = [d for d in deltas if d["part"] == number]
            joined = "".join(d["delta"] for d in pieces)
            if part["type"] == "tool_call":
                assert json.loads(joined) == part["arguments"], (joined, part)
                assert (pieces[0]["call_id"], pieces[0]["tool"]) == (part["id"], part["name"])
            elif part["type"] == "text":
                assert joined == part["text"], (joined, part)
    # Each tool ran once: counted inside the sandbox.
    counted = team.exec(done["sandbox_id"], "cat /work/.count")
    assert counted["stdout"] == "x\n", counted
    steps = team.call("GET", f"/v1/agent-runs/{run['id']}/steps")["steps"]
    assert [s["kind"] for s in steps] == ["model", "tool"] * 3 + ["model"], steps
    assert all(s["state"] == "completed" for s in steps), steps
    assert steps[1]["result"]["exec_id"] == f"{run['id']}-2"
    # The run ends on cancel: its sandbox is destroyed and its key revoked.
    team.call("POST", f"/v1/agent-runs/{run['id']}/cancel", {"scope": "run"})
    ended = team.wait(run["id"], statuses=("cancelled",))
    assert ended["finished_at"], ended
    sandbox = team.call("GET", f"/v1/sandboxes/{done['sandbox_id']}")
    assert sandbox["state"] == "stopped", sandbox


def test_a_client_function_waits_for_its_result_then_the_run_goes_on(team):
    steps = [{"tool": "lookup", "arguments": {"city": "Paris"}}, {"text": "It is sunny."}]
    weather = {"type": "function", "name": "lookup", "description": "The weather of a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    run = team.run("openai/gpt-test", "function", steps, tools=[weather])
    waiting = team.wait(run["id"])
    assert waiting["status"] == "requires_action", waiting
    (action,) = waiting["required_actions"]
    assert (action["type"], action["name"], action["arguments"]) == (
        "tool_result", "lookup", {"city": "Paris"})
    # A result for another call is refused; the run is unchanged.
    with pytest.raises(urllib.error.HTTPError) as refused:
        team.call("POST", f"/v1/agent-runs/{run['id']}/inputs",
                  {"type": "tool_result", "call_id": "nope", "output": "x"})
    assert refused.value.code == 409
    assert json.loads(refused.value.read())["error"]["code"] == "not_waiting_for_tool_result"
    team.call("POST", f"/v1/agent-runs/{run['id']}/inputs",
              {"type": "tool_result", "call_id": action["call_id"], "output": "SUNNY"},
              gateway=1)
    done = team.wait(run["id"], statuses=("idle",))
    assert done["required_actions"] == [] and done["tool_calls"] == 0, done
    # A message makes another turn.
    team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", {"type": "message", "content": "thanks"})
    again = team.wait(run["id"], statuses=("idle",))
    assert again["turns"] == 2, again


def test_another_team_sees_nothing_of_a_run(team, cluster):
    from tests.harness.conftest import Team
    run = team.run("openai/gpt-test", "plain", [{"text": "hi"}], tools=())
    other = Team(cluster)
    for method, path, body in [("GET", "", None), ("GET", "/events", None), ("GET", "/steps", None),
                               ("POST", "/cancel", {}), ("DELETE", "", None),
                               ("POST", "/inputs", {"type": "message", "content": "x"})]:
        with pytest.raises(urllib.error.HTTPError) as refused:
            other.call(method, f"/v1/agent-runs/{run['id']}{path}", body)
        assert refused.value.code == 404, (method, path)
    assert team.wait(run["id"])["status"] == "idle"


def error_of(refused):
    return refused.value.code, json.loads(refused.value.read())["error"]["code"]


def test_a_model_overloaded_twice_is_retried_and_the_run_completes(team):
    team.cluster.standin.script("retry", [{"text": "fine at last"}])
    run = team.call("POST", "/v1/agent-runs", {
        "model": "anthropic/claude-test", "input": "[[script:retry]] go [[overloaded:2]]"})
    done = team.wait(run["id"])
    assert done["status"] == "idle", done
    events = team.events(run["id"])
    retries = [e["data"] for e in events if e["type"] == "model.retry"]
    assert [(r["attempt"], r["status"]) for r in retries] == [(1, 529), (2, 529)], retries
    (step,) = team.call("GET", f"/v1/agent-runs/{run['id']}/steps")["steps"]
    assert step["result"]["attempts"] == 3 and step["state"] == "completed", step


def test_a_cancelled_turn_interrupts_its_command_and_keeps_the_shell_session(team):
    steps = [{"tool": "shell", "arguments": {"command": "cd /tmp && sleep 600"}},
             {"tool": "shell", "arguments": {"command": "pwd"}},
             {"text": "back"}]
    run = team.run("openai/gpt-test", "cancel-turn", steps)
    import time
    deadline = time.time() + 60
    while not any(e["type"] == "tool.called" for e in team.events(run["id"])):
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(1)
    team.call("POST", f"/v1/agent-runs/{run['id']}/cancel", {"scope": "turn"})
    cancelled = team.wait(run["id"], statuses=("idle",), deadline=30)
    first = [e["data"] for e in team.events(run["id"]) if e["type"] == "tool.completed"]
    assert len(first) == 1 and first[0]["exit_code"] != 0, first
    team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", {"type": "message", "content": "go on"})
    done = team.wait(run["id"], statuses=("idle",))
    assert done["turns"] == cancelled["turns"] + 1, done
    outputs = [e["data"]["output"] for e in team.events(run["id"]) if e["type"] == "tool.completed"]
    assert outputs[-1].splitlines()[:2] == ["exit code 0", "/tmp"], outputs


def test_ten_mib_of_output_reaches_the_model_as_16_kib(team):
    steps = [{"tool": "shell", "arguments": {"command": "head -c 10485760 /dev/zero | tr '\\0' a; echo END"}},
             {"text": "seen"}]
    run = team.run("openai/gpt-test", "big-output", steps)
    assert team.wait(run["id"])["status"] == "idle"
    sent = [r for r in team.cluster.standin.requests("[[script:big-output]]")]
    tool_messages = [m["content"] for r in sent for m in r["body"]["messages"] if m.get("role") == "tool"]
    assert tool_messages, sent
    assert all(len(text.encode()) <= 16 * 1024 for text in tool_messages), [len(t) for t in tool_messages]
    assert "bytes elided" in tool_messages[0] and tool_messages[0].rstrip().endswith("END")
    # The journal streamed 64 KiB of it, in rows of 4 KiB at most, not ten MiB.
    deltas = [e["data"]["delta"] for e in team.events(run["id"]) if e["type"] == "tool.output.delta"]
    assert sum(len(d) for d in deltas) == 64 * 1024, sum(len(d) for d in deltas)
    assert all(len(d) <= 4096 for d in deltas) and set("".join(deltas)) == {"a"}


def test_a_commands_output_streams_as_it_is_printed(team):
    import datetime
    command = "for i in 1 2 3 4 5; do echo line$i; sleep 0.3; done; echo oops >&2"
    steps = [{"tool": "shell", "arguments": {"command": command}}, {"text": "printed"}]
    run = team.run("openai/gpt-test", "slow-output", steps)
    assert team.wait(run["id"])["status"] == "idle"
    events = team.events(run["id"])
    deltas = [e for e in events if e["type"] == "tool.output.delta"]
    (completed,) = [e for e in events if e["type"] == "tool.completed"]
    (called,) = [e for e in events if e["type"] == "tool.called"]
    assert {d["data"]["call_id"] for d in deltas} == {called["data"]["call_id"]}

    def joined(stream):
        return "".join(d["data"]["delta"] for d in deltas if d["data"]["stream"] == stream)
    assert joined("stdout") == "".join(f"line{i}\n" for i in range(1, 6)), deltas
    assert joined("stderr") == "oops\n", deltas

    def at(event):
        return datetime.datetime.fromisoformat(event["at"].replace("Z", "+00:00"))
    # As it was printed: the first line was journaled more than a second before the end.
    assert (at(completed) - at(deltas[0])).total_seconds() > 1.0, (deltas[0], completed)


def test_bad_requests_get_clear_errors_and_leave_the_run_intact(team):
    bad = [
        ({"model": "nope/none", "input": "hi"}, 422, "invalid_request"),
        ({"model": "openai/gpt-test", "input": "hi", "tools": [{"type": "rocket"}]}, 422, "invalid_request"),
        ({"model": "openai/gpt-test", "input": "hi\u0000"}, 422, "invalid_request"),
        ({"model": "openai/gpt-test", "input": "hi", "tools": [{"type": "shell"}, {"type": "shell"}]}, 422, "invalid_request"),
        ({"model": "openai/gpt-test", "input": "hi", "sandbox": {"id": "00000000-0000-0000-0000-000000000000"}}, 404, "not_found"),
        ({"model": "openai/gpt-test", "input": "x" * (2 * 1024 * 1024)}, 413, "payload_too_large"),
    ]
    for body, status, code in bad:
        with pytest.raises(urllib.error.HTTPError) as refused:
            team.call("POST", "/v1/agent-runs", body)
        assert error_of(refused) == (status, code), body.get("tools") or body["model"]
    run = team.run("openai/gpt-test", "intact", [{"text": "ok"}], tools=())
    assert team.wait(run["id"])["status"] == "idle"
    for body, status in [({"type": "message", "content": "a\u0000b"}, 422), ({"type": "nope"}, 422),
                         ({"type": "tool_result", "call_id": "c", "output": "x"}, 409)]:
        with pytest.raises(urllib.error.HTTPError) as refused:
            team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", body)
        assert refused.value.code == status, body
    team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", {"type": "message", "content": "again"})
    assert team.wait(run["id"], statuses=("idle",))["turns"] == 2


def test_the_same_idempotency_key_answers_the_first_run(team, cluster):
    import urllib.request
    body = {"model": "openai/gpt-test", "input": "[[script:idem]] hi"}
    team.cluster.standin.script("idem", [{"text": "once"}])

    def create(payload):
        request = urllib.request.Request(
            f"{cluster.urls[0]}/v1/agent-runs", data=json.dumps(payload).encode(), method="POST",
            headers={"authorization": f"Bearer {team.token}", "content-type": "application/json",
                     "idempotency-key": "key-1"})
        with urllib.request.urlopen(request) as answer:
            return answer.status, json.loads(answer.read())

    (first_status, first), (second_status, second) = create(body), create(body)
    assert (first_status, second_status) == (201, 200) and first["id"] == second["id"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        create({**body, "input": "other"})
    assert error_of(refused) == (422, "idempotency_key_reused")


def test_revoking_the_creators_key_ends_the_run(team):
    child = team.call("POST", "/v1/api-keys", {"name": "agent maker"})
    wait = {"type": "function", "name": "wait_here"}
    team.cluster.standin.script("revoke", [{"tool": "wait_here", "arguments": {}}])
    run = team.call("POST", "/v1/agent-runs", {"model": "openai/gpt-test",
                                                "input": "[[script:revoke]] go", "tools": [wait]},
                    token=child["token"])
    assert team.wait(run["id"])["status"] == "requires_action"
    team.call("DELETE", f"/v1/api-keys/{child['id']}")
    ended = team.wait(run["id"], statuses=("failed",), deadline=30)
    assert ended["error"]["code"] == "key_revoked", ended
    # Its sandbox stops with its key (the gateways' key_ended job, every second).
    import time
    deadline = time.time() + 15
    while (sandbox := team.call("GET", f"/v1/sandboxes/{ended['sandbox_id']}"))["state"] != "stopped":
        assert time.time() < deadline, sandbox
        time.sleep(0.2)
    assert sandbox["stop_reason"] in ("key_revoked", "destroyed"), sandbox


def test_read_only_mcp_calls_run_side_by_side_and_the_rest_in_order(team, cluster):
    peek = {"tool": "upstream__peek", "arguments": {"seconds": 1}}
    steps = [{"tools": [peek, peek]}, {"text": "looked twice"}]
    run = team.run("openai/gpt-test", "mcp-peek", steps, tools=[{"type": "mcp", "server": "upstream"}])
    done = team.wait(run["id"])
    assert done["status"] == "idle" and done["tool_calls"] == 2, done
    tools = [s for s in team.call("GET", f"/v1/agent-runs/{run['id']}/steps")["steps"] if s["kind"] == "tool"]
    assert [s["name"] for s in tools] == ["upstream__peek"] * 2, tools
    import datetime
    at = lambda text: datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    span = max(at(s["finished_at"]) for s in tools) - min(at(s["started_at"]) for s in tools)
    assert span.total_seconds() < 1.6, span
    outputs = [e["data"]["output"] for e in team.events(run["id"]) if e["type"] == "tool.completed"]
    assert outputs == ["seen", "seen"], outputs
    assert open(cluster.mcp_calls).read().count("peek") >= 2


def test_a_call_waits_for_a_persons_approval_on_another_gateway(team, cluster):
    from tests.support.gateways import psql
    steps = [{"tool": "shell", "arguments": {"command": "echo data > /work/keep.txt"}},
             {"tool": "shell", "arguments": {"command": "rm -f /work/nothing && cat /work/keep.txt"}},
             {"text": "approved and done"}]
    rules = [{"tool": "shell", "match": "^rm ", "policy": "ask"}]
    run = team.run("openai/gpt-test", "approve", steps, approvals=rules)
    waiting = team.wait(run["id"])
    assert waiting["status"] == "requires_action" and waiting["tool_calls"] == 1, waiting
    (action,) = waiting["required_actions"]
    assert (action["type"], action["tool"], action["rule"]) == ("approval", "shell", 0), action
    decide = {"type": "approval", "call_id": action["call_id"], "decision": "allow"}
    # A member below the creator's role may not decide.
    member = team.call("POST", "/v1/api-keys", {"name": "member", "role": "member"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", decide, token=member["token"])
    assert error_of(refused) == (403, "forbidden")
    # Nor may the run's own key (played by a key of the test's, made the run's).
    own = team.call("POST", "/v1/api-keys", {"name": "own", "role": "owner"})
    psql(f"UPDATE agent_runs SET run_key_id = '{own['id']}' WHERE id = '{run['id']}'",
         database=cluster.database_url)
    with pytest.raises(urllib.error.HTTPError) as refused:
        team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", decide, token=own["token"])
    assert error_of(refused) == (403, "forbidden")
    # 20 s later (a sandbox nobody kept alive lives 5 s here), a person decides on the other
    # gateway; the next tool sees the first tool's file.
    import time
    time.sleep(20)
    team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", {**decide, "reason": "fine"}, gateway=1)
    done = team.wait(run["id"], statuses=("idle",))
    outputs = [e["data"]["output"] for e in team.events(run["id"]) if e["type"] == "tool.completed"]
    assert outputs[-1].splitlines()[1] == "data", outputs
    resolved = [e["data"] for e in team.events(run["id"]) if e["type"] == "approval.resolved"]
    assert [(r["decision"], r["reason"]) for r in resolved] == [("allow", "fine")], resolved
    assert done["tool_calls"] == 2, done


def test_a_denied_call_does_not_run_and_the_model_is_told(team):
    steps = [{"tool": "shell", "arguments": {"command": "echo ran >> /work/.denied"}},
             {"text": "understood"}]
    rules = [{"tool": "shell", "match": "denied", "policy": "deny"}]
    run = team.run("openai/gpt-test", "deny", steps, approvals=rules)
    done = team.wait(run["id"])
    assert done["status"] == "idle", done
    (completed,) = [e["data"] for e in team.events(run["id"]) if e["type"] == "tool.completed"]
    assert completed["is_error"] and "denied by the run's approval rules" in completed["output"]
    counted = team.exec(done["sandbox_id"], "cat /work/.denied 2>/dev/null; echo end")
    assert counted["stdout"] == "end\n", counted


def test_a_cancelled_call_gives_the_model_an_error_and_the_turn_goes_on(team):
    import time
    steps = [{"tool": "shell", "arguments": {"command": "sleep 600"}},
             {"tool": "shell", "arguments": {"command": "echo after"}},
             {"text": "went on"}]
    run = team.run("openai/gpt-test", "cancel-tool", steps)
    deadline = time.time() + 60
    while not (called := [e for e in team.events(run["id"]) if e["type"] == "tool.called"]):
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(1)
    team.call("POST", f"/v1/agent-runs/{run['id']}/cancel",
              {"scope": "tool", "call_id": called[0]["data"]["call_id"]})
    done = team.wait(run["id"], statuses=("idle",), deadline=30)
    assert (done["turns"], done["tool_calls"]) == (1, 2), done
    first, second = [e["data"] for e in team.events(run["id"]) if e["type"] == "tool.completed"]
    assert first["is_error"] and "cancelled by the client" in first["output"], first
    assert second["output"].splitlines()[1] == "after", second
    with pytest.raises(urllib.error.HTTPError) as refused:
        team.call("POST", f"/v1/agent-runs/{run['id']}/cancel", {"scope": "turn", "call_id": "x"})
    assert error_of(refused) == (422, "invalid_request")


def test_older_tool_outputs_are_left_out_near_the_context_window(team):
    big = {"tool": "shell", "arguments": {"command": "head -c 5000 /dev/zero | tr '\\0' b"}}
    run = team.run("openai/gpt-tiny", "elide", [big, big, {"text": "fits"}])
    assert team.wait(run["id"])["status"] == "idle"
    (elided,) = [e["data"] for e in team.events(run["id"]) if e["type"] == "context.elided"]
    assert elided["count"] == 1, elided
    last = team.cluster.standin.requests("[[script:elide]]")[-1]["body"]["messages"]
    outputs = [m["content"] for m in last if m.get("role") == "tool"]
    assert "left out to fit the model's context" in outputs[0] and "bbbb" in outputs[1], outputs


def test_a_create_can_wait_for_its_first_turn_or_stream_it(team, cluster):
    import http.client
    import urllib.parse
    steps = [{"tool": "shell", "arguments": {"command": "echo waited"}}, {"text": "turn over"}]
    cluster.standin.script("wait-turn", steps)
    body = {"model": "openai/gpt-test", "input": "[[script:wait-turn]] go",
            "tools": [{"type": "shell"}], "background": False}
    run = team.call("POST", "/v1/agent-runs", body)
    assert run["status"] == "idle" and run["tool_calls"] == 1, run
    (turn,) = team.call("GET", f"/v1/agent-runs/{run['id']}/turns")["turns"]
    assert (turn["turn"], turn["model_steps"], turn["tool_steps"]) == (1, 2, 1), turn
    assert turn["cost_micro"] > 0 and turn["completed_at"] and turn["input"], turn
    # Streamed: the events of the first turn, the same bytes a later replay gives, and the
    # stream ends when the turn does.
    cluster.standin.script("stream-turn", steps)
    parsed = urllib.parse.urlparse(cluster.urls[1])
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    connection.request("POST", "/v1/agent-runs", json.dumps(
        {**body, "input": "[[script:stream-turn]] go", "background": True, "stream": True}),
        {"authorization": f"Bearer {team.token}", "content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 201 and response.getheader("content-type") == "text/event-stream"
    streamed = response.read()
    frames = [f for f in streamed.split(b"\n\n") if f]
    kinds = [f.split(b"\n")[1][len(b"event: "):].decode() for f in frames]
    assert kinds[0] == "run.created" and "tool.completed" in kinds, kinds
    assert kinds[-1] == "run.status", kinds
    run_id = json.loads(frames[0].split(b"data: ", 1)[1])["run_id"]
    replay = team.events(run_id)
    assert [e["seq"] for e in replay[:len(frames)]] == list(range(1, len(frames) + 1))


def test_a_limit_reached_asks_for_more_and_the_run_goes_on(team):
    steps = [{"tool": "shell", "arguments": {"command": "echo one >> /work/limit.txt"}},
             {"tool": "shell", "arguments": {"command": "echo two >> /work/limit.txt"}},
             {"text": "both"}]
    run = team.run("openai/gpt-test", "limit-ask", steps,
                   limits={"max_tool_calls": 1, "on_limit": "ask"})
    waiting = team.wait(run["id"])
    assert waiting["status"] == "requires_action" and waiting["tool_calls"] == 1, waiting
    assert waiting["required_actions"] == [
        {"type": "limit", "limit": "max_tool_calls",
         "message": "the run reached its `max_tool_calls`"}], waiting
    # A member below the run creator's role may not raise its limits.
    member = team.call("POST", "/v1/api-keys", {"name": "low", "role": "member"})
    raise_ = {"type": "limits", "limits": {"max_tool_calls": 5}}
    with pytest.raises(urllib.error.HTTPError) as refused:
        team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", raise_, token=member["token"])
    assert refused.value.code == 403
    team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", raise_)
    done = team.wait(run["id"], statuses=("idle", "failed", "limited"))
    assert done["status"] == "idle" and done["tool_calls"] == 2, done
    assert done["limits"]["max_tool_calls"] == 5 and done["limits"]["on_limit"] == "ask"
    assert team.exec(done["sandbox_id"], "cat /work/limit.txt")["stdout"] == "one\ntwo\n"


@pytest.mark.parametrize("model", MODELS)
def test_an_answer_streams_as_coalesced_deltas_and_a_replay_is_the_same_bytes(team, cluster, model):
    import http.client
    import time
    import urllib.parse
    from tests.harness.conftest import Sse
    # 200 pieces, 5 ms apart: about a second of streaming, live and coalesced.
    parsed = urllib.parse.urlparse(cluster.urls[0])
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    body = {"model": model, "input": "say it [[deltas:200]]", "tools": [{"type": "shell"}],
            "stream": True}
    connection.request("POST", "/v1/agent-runs", json.dumps(body),
                       {"authorization": f"Bearer {team.token}", "content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 201, response.read()
    live, raw, seen = [], b"", {}
    while line := response.readline():
        raw += line
        if line == b"\n":
            event = json.loads([l[6:] for l in raw.split(b"\n") if l.startswith(b"data: ")][0])
            live.append(raw)
            seen.setdefault(event["type"], time.monotonic())
            raw = b""
    connection.close()
    run_id = json.loads(live[0].split(b"data: ", 1)[1])["run_id"]
    events = team.events(run_id)
    deltas = [e for e in events if e["type"] == "model.delta"]
    (completed,) = [e["data"] for e in events if e["type"] == "model.completed"]
    text = completed["message"]["content"][-1]["text"]
    assert text == "word " * 200 or text == ("word " * 200).strip(), text
    assert "".join(d["data"]["delta"] for d in deltas) == text
    # Coalesced: about ten rows a second, not two hundred, each at most 4 KiB and at least
    # 100 ms after the one before (by the journal's clock, to the millisecond) — but the
    # last, written as the stream ends.
    assert 4 <= len(deltas) <= 25, len(deltas)
    assert all(len(d["data"]["delta"].encode()) <= 4096 for d in deltas)
    import datetime
    ats = [datetime.datetime.fromisoformat(d["at"].replace("Z", "+00:00")) for d in deltas]
    gaps = [(b - a).total_seconds() for a, b in zip(ats, ats[1:])]
    assert min(gaps[:-1]) >= 0.095, gaps
    # Live: the first piece reached the client well before the answer was complete.
    assert seen["model.completed"] - seen["model.delta"] > 0.5, seen
    # A replay from another gateway is the same bytes, frame for frame.
    replay = Sse(cluster.urls[1], team.token, run_id)
    frames = []
    for frame, _ in replay.frames():
        frames.append(frame)
        if len(frames) == len(live):
            break
    replay.close()
    assert frames == live
