"""What a waiting run keeps: the sandbox it made, paused, for `max_wait_secs`; then released
(snapshotted first with `checkpoints: every_turn`) and restored from that snapshot when the
run is stepped again."""

import time


def wait_for_event(team, run_id, kind, deadline=60):
    end = time.time() + deadline
    while True:
        found = [e for e in team.events(run_id) if e["type"] == kind]
        if found:
            return found
        assert time.time() < end, f"no {kind} event"
        time.sleep(0.2)


def test_a_sandbox_released_after_max_wait_is_restored_for_the_next_turn(team):
    steps = [{"tool": "shell", "arguments": {"command": "echo kept > /work/keep.txt && sleep 600"}},
             {"tool": "shell", "arguments": {"command": "cat /work/keep.txt"}},
             {"text": "restored"}]
    run = team.run("openai/gpt-test", "release", steps, max_wait_secs=2,
                   checkpoints="every_turn")
    wait_for_event(team, run["id"], "tool.called")
    time.sleep(1)
    team.call("POST", f"/v1/agent-runs/{run['id']}/cancel", {"scope": "turn"})
    first = team.wait(run["id"], statuses=("idle",))
    (taken,) = wait_for_event(team, run["id"], "checkpoint.taken")
    (released,) = wait_for_event(team, run["id"], "sandbox.released")
    assert released["data"]["sandbox_id"] == first["sandbox_id"], released
    assert released["data"]["snapshot_id"] not in (None, taken["data"]["snapshot_id"]), released
    gone = team.call("GET", f"/v1/sandboxes/{first['sandbox_id']}")
    assert gone["state"] == "stopped", gone
    waiting = team.call("GET", f"/v1/agent-runs/{run['id']}")
    assert waiting["sandbox_id"] is None and waiting["status"] == "idle", waiting
    assert waiting["checkpoint"] == released["data"]["snapshot_id"], waiting
    # The next turn starts a sandbox from the snapshot: the file is there.
    team.call("POST", f"/v1/agent-runs/{run['id']}/inputs", {"type": "message", "content": "go on"})
    done = team.wait(run["id"], statuses=("idle", "failed"))
    assert done["status"] == "idle" and done["sandbox_id"] not in (None, first["sandbox_id"])
    outputs = [e["data"]["output"] for e in team.events(run["id"]) if e["type"] == "tool.completed"]
    assert "kept" in outputs[-1], outputs
