"""A smolagents CodeAgent whose Python runs in a SandBase sandbox, its model a SandBase store
model: one key for the sandbox and the model.

    pip install 'sandbase[smolagents]' 'smolagents[openai]'
    export SANDBASE_URL=http://localhost:8080 SANDBASE_API_KEY=sb_...
    python smolagents_task.py "What is the 20th Fibonacci number? Compute it."

The agent's steps share one Python context in the sandbox (a variable of one step is there in
the next); the model is called through the store's OpenAI-compatible route, metered against
the team's credits; the sandbox is destroyed when the agent is cleaned up."""

import os
import sys

from smolagents import CodeAgent, OpenAIServerModel

from sandbase.integrations.smolagents import SandbaseExecutor

MODEL = os.environ.get("SANDBASE_MODEL", "openai/gpt-4.1-mini")


def main(task: str) -> None:
    url = os.environ.get("SANDBASE_URL", "http://localhost:8080").rstrip("/")
    model = OpenAIServerModel(model_id=MODEL, api_base=f"{url}/openai/v1", api_key=os.environ["SANDBASE_API_KEY"])
    with CodeAgent(tools=[], model=model, executor=SandbaseExecutor(template="base"), max_steps=8) as agent:
        print(agent.run(task))


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "Compute the sum of the squares of 1..100 and check it with a formula")
