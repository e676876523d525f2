"""The OpenAI Agents SDK's SandboxAgent solving a task in a SandBase sandbox, its model a
SandBase store model: one key for the sandbox and the model.

    pip install 'sandbase[openai-agents]'
    export SANDBASE_URL=http://localhost:8080 SANDBASE_API_KEY=sb_...
    python openai_agents_task.py "Write fizzbuzz.py in the workspace and run it for 1..15"

The model is called through the store's OpenAI route (`/openai/v1/responses`), which meters
it against the team's credits; the sandbox reaches no host (no egress asked for) and is
destroyed when the run ends."""

import asyncio
import os
import sys

from agents import Runner, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel
from agents.run import RunConfig
from agents.sandbox import SandboxAgent, SandboxRunConfig
from openai import AsyncOpenAI

from sandbase.integrations.openai_agents import SandbaseSandboxClient, SandbaseSandboxClientOptions

MODEL = os.environ.get("SANDBASE_MODEL", "openai/gpt-4.1-mini")


async def main(task: str) -> None:
    # Traces would go to OpenAI's platform: a self-hosted setup keeps them home.
    set_tracing_disabled(True)
    url = os.environ.get("SANDBASE_URL", "http://localhost:8080").rstrip("/")
    model = OpenAIResponsesModel(
        model=MODEL, openai_client=AsyncOpenAI(base_url=f"{url}/openai/v1", api_key=os.environ["SANDBASE_API_KEY"]))
    agent = SandboxAgent(name="builder", model=model,
                         instructions="Solve the task in the workspace with the shell; say what you did.")
    config = RunConfig(sandbox=SandboxRunConfig(
        client=SandbaseSandboxClient(), options=SandbaseSandboxClientOptions(template="base", timeout_secs=1800)))
    result = await Runner.run(agent, task, run_config=config, max_turns=20)
    print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "Print the kernel version and the free disk space of the workspace"))
