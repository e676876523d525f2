"""mini-swe-agent solving a task in a SandBase sandbox, its model a SandBase store model: one
key for the sandbox and the model.

    pip install 'sandbase[mini-swe-agent]'
    export SANDBASE_URL=http://localhost:8080 SANDBASE_API_KEY=sb_...
    python mini_swe_agent_task.py "Write fizzbuzz.py in /work and run it for 1..15"

The model is called through the store's OpenAI-compatible route (litellm's `openai/`
prefix, then the store's model id); the store meters it against the team's credits. The
sandbox is destroyed when the run ends, whatever happens."""

import os
import sys

# litellm reads its price table from the network unless told to use its own copy (the store
# prices the call anyway): keep a self-hosted setup offline.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.models.litellm_model import LitellmModel

from sandbase.integrations.mini_swe_agent import SandbaseEnvironment

MODEL = os.environ.get("SANDBASE_MODEL", "openai/gpt-4.1-mini")


def main(task: str) -> None:
    url = os.environ.get("SANDBASE_URL", "http://localhost:8080").rstrip("/")
    model = LitellmModel(
        model_name=f"openai/{MODEL}",
        model_kwargs={"api_base": f"{url}/openai/v1", "api_key": os.environ["SANDBASE_API_KEY"]},
        # The store bills the call; litellm's own price table may not know the model.
        cost_tracking="ignore_errors",
    )
    environment = SandbaseEnvironment(template="base", timeout=60)
    agent_config = get_config_from_spec("mini.yaml")["agent"]
    try:
        result = DefaultAgent(model, environment, **agent_config).run(task)
    finally:
        environment.cleanup()
    print(result.get("exit_status"), result.get("submission"), sep="\n")


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "Print the kernel version and the free disk space of /work")
