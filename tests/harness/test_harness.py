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
