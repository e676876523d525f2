"""A smolagents remote executor whose code runs in a SandBase sandbox.

    pip install 'sandbase[smolagents]'

    from smolagents import CodeAgent
    from sandbase.integrations.smolagents import SandbaseExecutor

    agent = CodeAgent(tools=[], model=model, executor=SandbaseExecutor(egress=["pypi.org"]))

The agent's code runs through SandBase's code endpoint in one context of one sandbox: its
variables, imports and working directory live on from one step to the next, as they do in
smolagents' E2B, Modal and Docker executors. `print` output comes back as the step's logs,
the last expression as its output (an image as a PIL image), an exception as the error the
agent shows its model. Tools are defined in the sandbox the way smolagents' other remote
executors define them; packages named in `additional_imports` that the sandbox's template
does not have are installed with pip (the sandbox's egress must allow the package index).

The sandbox reaches only the hosts `egress` names (none by default) and is destroyed by
`cleanup()` (which `CodeAgent.cleanup()` and leaving `with agent:` call), when the executor
is garbage-collected, or at the latest when its own `sandbox_timeout` runs out (the process
that made it may die without cleaning up)."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from io import BytesIO
from typing import Any

from .._sync import Sandbase, Sandbox

try:
    import PIL.Image
    from smolagents.local_python_executor import CodeOutput
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.tools import get_tools_definition_code
    from smolagents.utils import AgentError
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError("smolagents is not installed: pip install 'sandbase[smolagents]'") from missing

# The results shown as the step's output, best first (an image becomes a PIL image).
IMAGE_TYPES = ("image/png", "image/jpeg")
# Module names whose package on PyPI has another name.
PACKAGES = {"PIL": "pillow", "sklearn": "scikit-learn", "cv2": "opencv-python", "yaml": "pyyaml",
            "bs4": "beautifulsoup4"}
MODULES = {package: module for module, package in PACKAGES.items()}
TEXT_TYPES = ("application/json", "text/html", "text/markdown", "image/svg+xml", "text/plain")


class SandbaseExecutor(RemotePythonExecutor):
    """smolagents' `RemotePythonExecutor` over one SandBase sandbox and one code context."""

    def __init__(
        self,
        additional_imports: list[str] | None = None,
        logger: Any = None,
        allow_pickle: bool = False,
        *,
        template: str | None = None,
        egress: list[str] | None = None,
        credentials: list[str] | None = None,
        store: bool = False,
        cpu: float | None = None,
        memory_mb: int | None = None,
        env: Mapping[str, str] | None = None,
        timeout: int = 300,
        sandbox_timeout: int = 7200,
        pip_args: list[str] | None = None,
        client: Sandbase | None = None,
    ) -> None:
        """`timeout`: seconds one step's code may run before it is interrupted (its state
        kept); `sandbox_timeout`: seconds after which the sandbox is destroyed even if
        nobody cleans up; `pip_args`: more arguments of the `pip install` of missing imports
        (`["--index-url", "https://mirror.example/simple"]`)."""
        super().__init__(additional_imports or [], logger or AgentLogger(level=LogLevel.INFO), allow_pickle)
        self.timeout = timeout
        self.pip_args = list(pip_args or [])
        self.egress = list(egress or [])
        self.sandbox: Sandbox | None = None
        self.sandbox = Sandbox.create(
            template, egress=egress, credentials=credentials, timeout=sandbox_timeout, cpu=cpu,
            memory_mb=memory_mb, env=env, store=store, metadata={"framework": "smolagents"},
            client=client,
        )
        self.logger.log(f"SandBase sandbox {self.sandbox.id} is running", level=LogLevel.INFO)
        try:
            self.installed_packages = self._install(additional_imports or [], strict=True)
        except BaseException:
            self.cleanup()
            raise

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Runs `code` in the sandbox's context: its output, or the final answer; an
        exception the code raised becomes an `AgentError` the model reads."""
        assert self.sandbox is not None, "the sandbox was destroyed"
        result = self.sandbox.code.run(code, timeout=self.timeout)
        logs = result.stdout + result.stderr
        if result.exception is not None:
            if result.exception.name == self.FINAL_ANSWER_EXCEPTION:
                answer = self._deserialize_final_answer(result.exception.value, self.allow_pickle)
                return CodeOutput(output=answer, logs=logs, is_final_answer=True)
            if result.timed_out:
                raise AgentError(f"{logs}\nThe code was interrupted after {self.timeout} seconds.", self.logger)
            raise AgentError(
                f"{logs}\nExecuting code yielded an error:\n{result.exception.name}\n"
                f"{result.exception.value}\n{result.exception.traceback}",
                self.logger,
            )
        return CodeOutput(output=_shown(result.main), logs=logs, is_final_answer=False)

    def send_tools(self, tools: dict[str, Any]) -> None:
        """Defines the agent's tools in the sandbox as smolagents' other remote executors do,
        with the modules smolagents hoists to the top of their code (numpy and PIL, for the
        final answer's serialization) imported where the template has them."""
        if "final_answer" in tools:
            self._patch_final_answer_with_exception(tools["final_answer"])
        wanted = {
            PACKAGES.get(name, name)
            for tool in tools.values()
            for name in tool.to_dict()["requirements"]
            if name not in [*self.installed_packages, "smolagents"]
        }
        if wanted:
            self.installed_packages += self.install_packages(sorted(wanted))
        code = get_tools_definition_code(tools)
        if code:
            self.logger.log(self.run_code_raise_errors(_optional_imports(code)).logs)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Installs the packages smolagents asks for when it sends tools (those the template
        lacks), when the sandbox may reach a package index at all; one that cannot be
        installed is logged, and a tool that needs it fails when called, as the model reads."""
        return self._install(additional_imports, strict=False)

    def _install(self, names: list[str], *, strict: bool) -> list[str]:
        """Installs with pip (as the user's packages) what the template does not have of
        `names` (modules or packages; `*` patterns name nothing to install); a failure raises
        when `strict`."""
        modules = sorted({MODULES.get(name, name).split(".")[0] for name in names if name and "*" not in name})
        if not modules or self.sandbox is None:
            return names
        probe = (
            "import importlib.util as _u, json as _j\n"
            f"print(_j.dumps([n for n in {modules!r} if _u.find_spec(n) is None]))"
        )
        missing = json.loads(self.run_code_raise_errors(probe).logs.strip().splitlines()[-1])
        if missing and not strict and not self.egress:
            self.logger.log(f"Not installed (the sandbox has no egress): {', '.join(missing)}", level=LogLevel.INFO)
        elif missing:
            packages = [PACKAGES.get(name, name) for name in missing]
            self.logger.log(f"Installing {', '.join(packages)} in the sandbox", level=LogLevel.INFO)
            try:
                self._pip(packages)
            except AgentError as error:
                if strict:
                    raise
                self.logger.log(f"Not installed: {error}", level=LogLevel.INFO)
        return names

    def _pip(self, packages: list[str]) -> None:
        assert self.sandbox is not None
        argv = ["python3", "-m", "pip", "install", "--quiet", "--user", *self.pip_args, *packages]
        done = self.sandbox.commands.run(argv, timeout=self.timeout)
        if done.exit_code != 0 and "externally-managed-environment" in done.stderr:
            # A distribution's Python (PEP 668): the user's own site-packages are still theirs.
            done = self.sandbox.commands.run([*argv, "--break-system-packages"], timeout=self.timeout)
        if done.exit_code != 0:
            raise AgentError(f"pip could not install {' '.join(packages)}:\n{done.stderr[-4000:]}", self.logger)

    def cleanup(self) -> None:
        """Destroys the sandbox (once)."""
        sandbox, self.sandbox = getattr(self, "sandbox", None), None
        if sandbox is not None:
            try:
                sandbox.destroy()
            except Exception as error:  # its own timeout ends it anyway
                self.logger.log_error(f"Could not destroy SandBase sandbox {sandbox.id}: {error}")

    def __del__(self) -> None:
        self.cleanup()


def _shown(main: Mapping[str, str] | None) -> Any:
    """The step's output from the last expression's MIME bundle: an image as a PIL image,
    else its richest text."""
    if not main:
        return None
    for mime in IMAGE_TYPES:
        if mime in main:
            return PIL.Image.open(BytesIO(base64.b64decode(main[mime])))
    for mime in TEXT_TYPES:
        if mime in main:
            return main[mime]
    return None


# A top-level import of one module, or of names from one (no parentheses).
TOP_LEVEL_IMPORT = re.compile(r"^(import [\w.]+(?: as \w+)?|from [\w.]+ import [\w, ]+(?: as \w+)?)$")


def _optional_imports(code: str) -> str:
    """`code` with each top-level import line made optional (kept when the module is there)."""
    lines = []
    for line in code.splitlines():
        if TOP_LEVEL_IMPORT.match(line):
            lines += ["try:", f"    {line}", "except ImportError:", "    pass"]
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"
