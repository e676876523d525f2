"""An Inspect AI sandbox environment: each sample of an eval in a SandBase sandbox of its own.

    pip install 'sandbase[inspect]'

The environment registers under the name `sandbase` (through the `inspect_ai` entry point,
so installing the extra is enough): `Task(..., sandbox="sandbase")`, or with options
`sandbox=("sandbase", SandbaseSandboxConfig(template="base", egress=["pypi.org"]))`.

Each sample gets a new sandbox in `sample_init` (the key and URL from `SANDBASE_API_KEY`
and `SANDBASE_URL`), destroyed in `sample_cleanup` — also when the sample was interrupted —
and at the latest by its own timeout. Commands run as the sandbox's user (`user="root"` as
root; other users are refused, as Inspect expects), relative paths are under `/work`."""

from __future__ import annotations

import shlex
from typing import Any, Literal, Union, overload

from pydantic import BaseModel

from .. import _core
from .._async import AsyncSandbase, AsyncSandbox
from ..errors import NotFound, PermissionDenied, SandbaseError

try:
    from inspect_ai.util import (
        ExecResult,
        SandboxConnection,
        SandboxEnvironment,
        SandboxEnvironmentConfigType,
        sandboxenv,
    )
    from inspect_ai.util._sandbox.environment import SandboxUserUnsupportedError
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError("Inspect AI is not installed: pip install 'sandbase[inspect]'") from missing

WORK = "/work"


class SandbaseSandboxConfig(BaseModel, frozen=True):
    """A sample's sandbox: what `POST /v1/sandboxes` is given."""

    template: str | None = None
    egress: list[str] = []
    credentials: list[str] = []
    store: bool = False
    cpu: float | None = None
    memory_mb: int | None = None
    timeout: int = 3600
    """Seconds after which the sandbox is destroyed even if the eval never cleans up."""


def _config(config: SandboxEnvironmentConfigType | None) -> SandbaseSandboxConfig:
    if config is None:
        return SandbaseSandboxConfig()
    if isinstance(config, SandbaseSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        return SandbaseSandboxConfig(**config.model_dump())
    raise ValueError(f"the sandbase sandbox takes a SandbaseSandboxConfig, not {config!r}")


def _path(file: str) -> str:
    return file if file.startswith("/") else f"{WORK}/{file}"


@sandboxenv(name="sandbase")
class SandbaseSandboxEnvironment(SandboxEnvironment):
    """One sample's SandBase sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        super().__init__()
        self.sandbox = sandbox

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return SandbaseSandboxConfig(**config)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        settings = _config(config)
        sandbox = await AsyncSandbox.create(
            settings.template, egress=settings.egress or None,
            credentials=settings.credentials or None, timeout=settings.timeout, cpu=settings.cpu,
            memory_mb=settings.memory_mb, store=settings.store,
            metadata={"framework": "inspect", "task": task_name[:500]},
        )
        return {"default": cls(sandbox)}

    @classmethod
    async def sample_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment], interrupted: bool,
    ) -> None:
        for environment in environments.values():
            if isinstance(environment, SandbaseSandboxEnvironment):
                await environment.sandbox.destroy()

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        if user not in (None, "root", "user"):
            raise SandboxUserUnsupportedError(f"a SandBase sandbox runs as `user` or `root`, not {user!r}")
        stdin = input.decode() if isinstance(input, bytes) else input
        body = _core.exec_body(cmd, cwd=_path(cwd) if cwd else WORK, env=env, timeout=timeout,
                               stdin=stdin, session=None)
        if user:
            body["user"] = user
        client: AsyncSandbase = self.sandbox.client
        result = await client.call("POST", f"/v1/sandboxes/{self.sandbox.id}/exec", json=body)
        if result.get("timed_out"):
            raise TimeoutError(f"{shlex.join(cmd)} timed out after {timeout} s")
        code = int(result["exit_code"])
        return ExecResult(success=code == 0, returncode=code, stdout=result["stdout"],
                          stderr=result["stderr"])

    async def write_file(self, file: str, contents: str | bytes) -> None:
        path = _path(file)
        parent = path.rsplit("/", 1)[0] or "/"
        await self.exec(["mkdir", "-p", parent])
        try:
            await self.sandbox.files.write(path, contents)
        except PermissionDenied as denied:
            raise PermissionError(str(denied)) from denied
        except SandbaseError as refused:
            if refused.code == "is_a_directory":
                raise IsADirectoryError(path) from refused
            raise

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:
        path = _path(file)
        try:
            answer = await self.sandbox._send(
                _core.Call("GET", self.sandbox._paths.of("/files"), params={"path": path}))
        except NotFound as missing:
            raise FileNotFoundError(path) from missing
        except PermissionDenied as denied:
            raise PermissionError(str(denied)) from denied
        if answer.headers.get("content-type", "").startswith("application/json"):
            raise IsADirectoryError(path)
        return answer.content.decode("utf-8") if text else answer.content

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        command = f"sandbase sandbox shell {self.sandbox.id}"
        return SandboxConnection(type="sandbase", command=command,
                                 container=self.sandbox.id)
