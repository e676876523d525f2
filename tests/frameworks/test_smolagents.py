"""smolagents (the real package, pinned in smolagents.txt) running a CodeAgent whose code runs
in a SandBase sandbox through `sandbase.integrations.smolagents`, on a scripted model: the
variables of one step are there in the next (one code context for the run), a tool defined
on the host runs in the sandbox, the final answer comes back, errors reach the model as its
other executors give them, and the sandbox is gone after — also when the process that made
it is killed."""


import pytest
from smolagents import CodeAgent, tool
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.utils import AgentError

from sandbase.integrations.smolagents import SandbaseExecutor


class Scripted(Model):
    """A model that answers with the next of its replies, and keeps what it was shown."""

    def __init__(self, replies):
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.seen = []

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None,
                 **kwargs):
        self.seen.append([str(message.content if hasattr(message, "content") else message)
                          for message in messages])
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


def step(code):
    return f"Thought: next.\n<code>\n{code}\n</code>"


@tool
def where_am_i() -> str:
    """Tells where the code runs: the sandbox's user and working directory."""
    import getpass
    import os

    return f"{getpass.getuser()}@{os.getcwd()}"


def test_a_code_agent_keeps_a_variable_between_steps_in_its_sandbox(cluster, sandbase_env):
    executor = SandbaseExecutor(additional_imports=["json", "math"])
    sandbox_id = executor.sandbox.id
    running = cluster.sandboxes(sandbase_env, "running")
    assert [sandbox["id"] for sandbox in running] == [sandbox_id]
    assert running[0]["metadata"] == {"framework": "smolagents"}
    model = Scripted([
        # A variable, a file and output on both streams; a tool defined on the host.
        step("secret = 6 * 7\nopen('/work/note.txt', 'w').write('kept')\nprint('first step')\n"
             "import sys; print('to stderr', file=sys.stderr)\nwhere_am_i()"),
        # The next step sees the variable and the file: one context, one sandbox.
        step("final_answer({'secret': secret, 'note': open('/work/note.txt').read(), 'sqrt': math.sqrt(secret)})"),
    ])
    agent = CodeAgent(tools=[where_am_i], model=model, executor=executor, max_steps=4,
                      additional_authorized_imports=["json", "math"])
    try:
        answer = agent.run("compute a secret")
    finally:
        agent.cleanup()
    assert answer["secret"] == 42 and answer["note"] == "kept", answer
    assert abs(answer["sqrt"] - 6.4807406984) < 1e-9, answer
    # What the model read after the first step: the logs and the tool's result, from the sandbox.
    observation = "\n".join(model.seen[1])
    assert "first step" in observation and "to stderr" in observation, observation
    assert "user@/work" in observation, observation
    assert cluster.sandboxes(sandbase_env, "running") == []
    executor.cleanup()  # a second cleanup is harmless


def test_errors_and_images_come_back_in_the_frameworks_shape(cluster, sandbase_env):
    executor = SandbaseExecutor(timeout=2)
    try:
        with pytest.raises(AgentError) as raised:
            executor("values = [1, 2]\nvalues[5]")
        assert "IndexError" in str(raised.value) and "list index out of range" in str(raised.value)
        # An interrupted step keeps the context: the variable defined before it is still there.
        with pytest.raises(AgentError, match="interrupted after 2 seconds"):
            executor("import time\nbefore = 'still here'\ntime.sleep(30)")
        assert executor("before").output == "'still here'"
        # A value with a PNG form comes back as an image.
        shown = executor(
            "import base64\nclass Dot:\n    def _repr_png_(self):\n        return base64.b64decode("
            "'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\n"
            "Dot()")
        assert shown.output.size == (1, 1), shown
    finally:
        executor.cleanup()
    assert cluster.sandboxes(sandbase_env, "running") == []
    # An import the template lacks is installed with pip: without egress that fails, clearly,
    # and the sandbox made for it is destroyed.
    with pytest.raises(AgentError, match="pip could not install surely_not_a_module_xyz"):
        SandbaseExecutor(additional_imports=["math", "surely_not_a_module_xyz"],
                         pip_args=["--retries", "0", "--timeout", "3"])
    assert cluster.sandboxes(sandbase_env, "running") == []


KILLED = """
import os, sys, time
from sandbase.integrations.smolagents import SandbaseExecutor
executor = SandbaseExecutor(sandbox_timeout=int(sys.argv[1]))
print("SANDBOX", executor.sandbox.id, flush=True)
executor("x = 1")
time.sleep(600)
"""


def test_a_killed_process_leaves_no_sandbox_after_the_expiry_it_set(cluster, sandbase_env):
    cluster.killed_leaves_nothing(sandbase_env, KILLED)
