"""mini-swe-agent (the real package, pinned in mini-swe-agent.txt) running its default agent
in a SandBase sandbox through `sandbase.integrations.mini_swe_agent`, on a scripted
trajectory (its own DeterministicModel): each action runs in the sandbox, the submission
ends the run, the trajectory file is written, and the sandbox is gone after."""

import json
import os

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

import pytest
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.models.test_models import DeterministicModel

from sandbase.integrations.mini_swe_agent import SandbaseEnvironment

SYSTEM = "You are a helpful assistant that can do anything."
INSTANCE = "Your task: {{task}}. Please reply with a single shell command in triple backticks."


def action(command):
    """A scripted model message whose one action is `command`."""
    return {"role": "assistant", "content": f"```bash\n{command}\n```",
            "extra": {"actions": [{"command": command}]}}


def test_a_scripted_two_step_trajectory_ends_with_its_submission(cluster, sandbase_env, tmp_path):
    # Named by the short name in a config, as `mini` would read it.
    environment = get_environment({"environment_class": "sandbase", "timeout": 20,
                                   "env": {"GREETING": "hello from the sandbox"}})
    assert isinstance(environment, SandbaseEnvironment)
    sandbox_id = environment.sandbox.id
    running = cluster.sandboxes(sandbase_env, "running")
    assert [sandbox["id"] for sandbox in running] == [sandbox_id]
    assert running[0]["metadata"] == {"framework": "mini-swe-agent"}
    model = DeterministicModel(outputs=[
        # Output on both streams, in order; the working directory and environment given.
        action('echo "$GREETING" > greeting.txt; cat greeting.txt; echo to-stderr >&2; pwd; whoami'),
        action("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat /work/greeting.txt"),
    ])
    trajectory = tmp_path / "run.traj.json"
    agent = DefaultAgent(model, environment, system_template=SYSTEM, instance_template=INSTANCE,
                         step_limit=5, output_path=trajectory)
    try:
        result = agent.run("write a greeting")
    finally:
        environment.cleanup()
    assert result["exit_status"] == "Submitted", result
    assert result["submission"] == "hello from the sandbox\n"
    saved = json.loads(trajectory.read_text())
    assert saved["info"]["exit_status"] == "Submitted"
    observation = saved["messages"][3]["content"]
    assert "<returncode>0</returncode>" in observation, observation
    assert "hello from the sandbox\nto-stderr\n/work\nuser\n" in observation, observation
    assert saved["info"]["config"]["environment_type"].endswith("SandbaseEnvironment")
    # Cleaned up: the sandbox is destroyed, and a second cleanup is harmless.
    assert cluster.sandboxes(sandbase_env, "running") == []
    environment.cleanup()


def test_a_timeout_and_a_failing_command_come_back_in_the_frameworks_shape(cluster, sandbase_env):
    environment = SandbaseEnvironment(timeout=2, egress=[])
    try:
        slow = environment.execute({"command": "sleep 30"})
        assert slow["returncode"] == -1 and "timed out" in slow["exception_info"], slow
        failed = environment.execute({"command": "ls /nowhere"}, cwd="/tmp")
        assert failed["returncode"] != 0 and "/nowhere" in failed["output"], failed
        # No egress was asked for: the sandbox reaches nothing outside.
        reach = ("python3 -c \"import urllib.request; urllib.request.urlopen('http://example.com', "
                 "timeout=3)\" 2>/dev/null && echo online || echo offline")
        offline = environment.execute({"command": reach})
        assert offline["output"] == "offline\n", offline
    finally:
        environment.cleanup()
    assert cluster.sandboxes(sandbase_env, "running") == []


def test_the_sandbox_is_destroyed_when_the_run_raises(cluster, sandbase_env):
    environment = SandbaseEnvironment()
    model = DeterministicModel(outputs=[action("true")])  # then the script runs out
    agent = DefaultAgent(model, environment, system_template=SYSTEM, instance_template=INSTANCE)
    with pytest.raises(IndexError):
        try:
            agent.run("run out of script")
        finally:
            environment.cleanup()
    assert cluster.sandboxes(sandbase_env, "running") == []
