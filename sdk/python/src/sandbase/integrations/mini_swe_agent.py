"""A mini-swe-agent environment whose actions run in a SandBase sandbox.

    pip install 'sandbase[mini-swe-agent]'

In a mini-swe-agent config (`environment_class` names the class; importing this module also
registers the short name `sandbase`):

    environment:
      environment_class: sandbase.integrations.mini_swe_agent.SandbaseEnvironment
      template: base
      egress: [pypi.org, files.pythonhosted.org]

Each action runs in a fresh shell (`bash -lc`, as mini-swe-agent's local and Docker
environments do) with the configured working directory, environment and timeout; its
output is stdout and stderr as they interleaved, with its return code. The sandbox is made
when the environment is, reaches only the hosts `egress` names (none by default), and is
destroyed by `cleanup()`, when the environment is garbage-collected, or at the latest when
its own `sandbox_timeout` runs out (the process that made it may die without cleaning up)."""

from __future__ import annotations

import logging
import platform
from typing import Any

from pydantic import BaseModel

from .._sync import Sandbase, Sandbox

try:
    from minisweagent.environments import _ENVIRONMENT_MAPPING
    from minisweagent.exceptions import Submitted
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError("mini-swe-agent is not installed: pip install 'sandbase[mini-swe-agent]'") from missing

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SandbaseEnvironmentConfig(BaseModel):
    template: str | None = None
    """The sandbox's template (the deployment's default when unset)."""
    cwd: str = "/work"
    """Working directory in which to execute commands."""
    env: dict[str, str] = {}
    """Environment variables of every action."""
    timeout: int = 30
    """Seconds an action may run before it is killed."""
    egress: list[str] = []
    """Hosts the sandbox may reach (`api.github.com`, `*.pypi.org`); none by default."""
    credentials: list[str] = []
    """Team secrets the egress proxy injects into requests to their hosts."""
    store: bool = False
    """Let the sandbox call the store's models with the sandbox's own credential."""
    cpu: float | None = None
    memory_mb: int | None = None
    sandbox_timeout: int = 7200
    """Seconds after which the sandbox is destroyed even if nobody cleans up."""
    interpreter: list[str] = ["bash", "-lc"]
    """What runs each action; the action is its last argument."""


class SandbaseEnvironment:
    """mini-swe-agent's `Environment` protocol over one SandBase sandbox."""

    def __init__(
        self,
        *,
        config_class: type[SandbaseEnvironmentConfig] = SandbaseEnvironmentConfig,
        logger: logging.Logger | None = None,
        client: Sandbase | None = None,
        **kwargs: Any,
    ) -> None:
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.sandbox: Sandbox | None = None
        self.config = config_class(**kwargs)
        self.sandbox = Sandbox.create(
            self.config.template,
            egress=self.config.egress or None,
            credentials=self.config.credentials or None,
            timeout=self.config.sandbox_timeout,
            cpu=self.config.cpu,
            memory_mb=self.config.memory_mb,
            store=self.config.store,
            metadata={"framework": "mini-swe-agent"},
            client=client,
        )
        self.logger.info("Started SandBase sandbox %s", self.sandbox.id)

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Runs the action's command in a fresh shell in the sandbox; its output (stdout and
        stderr interleaved) and return code, as mini-swe-agent's environments answer."""
        assert self.sandbox is not None, "the sandbox was not made"
        command = action.get("command", "")
        # stderr joins stdout in the order the command wrote them, as `2>&1` would.
        argv = ["/bin/sh", "-c", 'exec 2>&1; exec "$@"', "sh", *self.config.interpreter, command]
        try:
            result = self.sandbox.commands.run(
                argv, cwd=cwd or self.config.cwd, env=self.config.env or None,
                timeout=timeout or self.config.timeout,
            )
        except Exception as error:  # the framework shows the model what went wrong
            output: dict[str, Any] = {
                "output": "", "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {error}",
                "extra": {"exception_type": type(error).__name__, "exception": str(error)},
            }
        else:
            output = {"output": result.stdout + result.stderr, "returncode": result.exit_code,
                      "exception_info": ""}
            if result.timed_out:
                output["returncode"] = -1
                output["exception_info"] = (
                    f"The command timed out after {timeout or self.config.timeout} seconds")
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Raises `Submitted` when the output says the task is done, as the others do."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        values: dict[str, Any] = {**self.config.model_dump(), **platform.uname()._asdict()}
        values["sandbox_id"] = self.sandbox.id if self.sandbox else None
        values.update(kwargs)
        return values

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {
            "environment": self.config.model_dump(mode="json"),
            "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
        }}}

    def cleanup(self) -> None:
        """Destroys the sandbox (once)."""
        sandbox, self.sandbox = getattr(self, "sandbox", None), None
        if sandbox is not None:
            try:
                sandbox.destroy()
            except Exception as error:  # its own timeout ends it anyway
                self.logger.warning("Could not destroy SandBase sandbox %s: %s", sandbox.id, error)

    def __del__(self) -> None:
        self.cleanup()


# `environment_class: sandbase` in a config, once this module is imported.
_ENVIRONMENT_MAPPING.setdefault("sandbase", f"{__name__}.SandbaseEnvironment")
