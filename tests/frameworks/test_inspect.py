"""Inspect AI (the real package, pinned in inspect.txt) running an eval with
`sandbox="sandbase"` — found through the SDK's entry point — against a real gateway and
worker: three samples, each in a SandBase sandbox of its own, scored; every sandbox
destroyed after, also the sample that failed."""

import pytest
from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput
from inspect_ai.scorer import match
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

from sandbase.integrations.inspect import SandbaseSandboxEnvironment

SEEN = []


@solver
def shout_in_the_sandbox():
    """Writes the sample's input into the sandbox, upper-cases it there with a command, and
    answers what the command printed; notes which sandbox each sample had."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        box = sandbox()
        await box.write_file("in/question.txt", state.input_text)
        assert await box.read_file("/work/in/question.txt") == state.input_text
        shouted = await box.exec(["sh", "-c", "tr a-z A-Z < in/question.txt; echo; whoami"])
        assert shouted.success, shouted.stderr
        root = await box.exec(["whoami"], user="root")
        SEEN.append((box.as_type(SandbaseSandboxEnvironment).sandbox.id, shouted.stdout.split()[1], root.stdout.strip()))
        if state.input_text == "fail":
            await box.read_file("no-such-file")
        state.output = ModelOutput.from_content(model="mockllm/model",
                                                content=shouted.stdout.split()[0])
        return state

    return solve


def test_three_samples_run_in_three_sandboxes_and_are_scored(cluster, sandbase_env, tmp_path):
    SEEN.clear()
    task = Task(
        dataset=[Sample(input=word, target=word.upper()) for word in ("alpha", "beta", "gamma")],
        solver=shout_in_the_sandbox(), scorer=match(), sandbox="sandbase",
    )
    [log] = inspect_eval(task, model="mockllm/model", log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    sandboxes = {sandbox_id for sandbox_id, _, _ in SEEN}
    assert len(sandboxes) == 3, SEEN
    assert {(user, root) for _, user, root in SEEN} == {("user", "root")}
    # Every sample's sandbox is gone.
    assert cluster.sandboxes(sandbase_env, "running") == []
    assert {s["metadata"]["framework"] for s in cluster.sandboxes(sandbase_env)} <= {"inspect"}


def test_a_failing_sample_still_has_its_sandbox_destroyed(cluster, sandbase_env, tmp_path):
    SEEN.clear()
    task = Task(dataset=[Sample(input="fail", target="FAIL")], solver=shout_in_the_sandbox(),
                scorer=match(), sandbox="sandbase")
    [log] = inspect_eval(task, model="mockllm/model", log_dir=str(tmp_path), display="none")
    assert log.status == "error"
    assert "FileNotFoundError" in str(log.error) or "no-such-file" in str(log.error), log.error
    assert len(SEEN) == 1
    assert cluster.sandboxes(sandbase_env, "running") == []


def test_a_user_the_sandbox_does_not_have_is_refused(cluster, sandbase_env, tmp_path):
    from inspect_ai.util._sandbox.environment import SandboxUserUnsupportedError

    @solver
    def as_nobody():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            with pytest.raises(SandboxUserUnsupportedError):
                await sandbox().exec(["true"], user="nobody")
            state.output = ModelOutput.from_content(model="mockllm/model", content="ok")
            return state
        return solve

    task = Task(dataset=[Sample(input="x", target="ok")], solver=as_nobody(), scorer=match(),
                sandbox="sandbase")
    [log] = inspect_eval(task, model="mockllm/model", log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
