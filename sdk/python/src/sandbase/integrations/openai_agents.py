"""A sandbox client for the OpenAI Agents SDK (`agents.sandbox`) whose sessions are SandBase
sandboxes.

    pip install 'sandbase[openai-agents]'

    from agents import Runner
    from agents.run import RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from sandbase.integrations.openai_agents import SandbaseSandboxClient, SandbaseSandboxClientOptions

    agent = SandboxAgent(name="builder", instructions="…")
    config = RunConfig(sandbox=SandboxRunConfig(
        client=SandbaseSandboxClient(),
        options=SandbaseSandboxClientOptions(egress=["pypi.org", "files.pythonhosted.org"]),
    ))
    result = await Runner.run(agent, "…", run_config=config)

Shaped like the SDK's Docker, E2B and Daytona clients: `create`, `delete` and `resume` (the
same sandbox while it lives, else a new one hydrated from the session's snapshot); a
session's `exec` runs as the sandbox's user (or `root`), `read` and `write` go through
SandBase's file API, `persist_workspace` is a tar stream of the workspace from the archive
API and `hydrate_workspace` unpacks one; `exec_command` with `tty=true` runs in a SandBase
terminal session (`write_stdin` types into it), without a TTY in a named command that is
interrupted when the session ends. Egress, credentials, resources and the isolation level
are SandBase's sandbox spec: the sandbox reaches only the hosts `egress` names (none by
default) and is destroyed when the session is deleted, or at the latest after its own
`timeout_secs` (the process that made it may die without deleting it)."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import Field

from .._async import AsyncSandbase, AsyncSandbox
from ..errors import NotFound, SandbaseError
from ._agents_pty import Processes

try:
    from agents.sandbox.errors import (
        ExecTimeoutError,
        ExecTransportError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
        WorkspaceStartError,
        WorkspaceWriteTypeError,
    )
    from agents.sandbox.manifest import Manifest
    from agents.sandbox.session import SandboxSession, SandboxSessionState
    from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
    from agents.sandbox.session.dependencies import Dependencies
    from agents.sandbox.session.manager import Instrumentation
    from agents.sandbox.session.pty_types import PtyExecUpdate
    from agents.sandbox.session.runtime_helpers import RESOLVE_WORKSPACE_PATH_HELPER, RuntimeHelperScript
    from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, User
    from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError("openai-agents is not installed: pip install 'sandbase[openai-agents]'") from missing

DEFAULT_WORKSPACE_ROOT = "/work"
# The users a SandBase command runs as.
RUN_AS = ("user", "root")


class SandbaseSandboxClientOptions(BaseSandboxClientOptions):
    """What a new SandBase sandbox is: SandBase's sandbox spec."""

    type: Literal["sandbase"] = "sandbase"
    template: str | None = None
    egress: list[str] = Field(default_factory=list)
    """Hosts the sandbox may reach (`pypi.org`, `*.github.com`); none by default."""
    credentials: list[str] = Field(default_factory=list)
    """Team secrets the egress proxy injects into requests to their hosts (never in the sandbox)."""
    store: bool = False
    """Let the sandbox call the store's models with its own credential."""
    cpu: float | None = None
    memory_mb: int | None = None
    isolation: Literal["runc", "gvisor"] | None = None
    """How the sandbox is isolated from its node (the deployment's default when unset)."""
    env: dict[str, str] = Field(default_factory=dict)
    timeout_secs: int = 7200
    """Seconds after which the sandbox is destroyed even if nobody deletes it."""
    exec_timeout_secs: int = 3600
    """Longest a command without a timeout of its own may run."""


class SandbaseSandboxSessionState(SandboxSessionState):
    """What resuming a session needs: its sandbox, and how to make another like it."""

    type: Literal["sandbase"] = "sandbase"
    sandbox_id: str
    options: SandbaseSandboxClientOptions


class SandbaseSandboxSession(BaseSandboxSession):
    """One SandBase sandbox as an openai-agents sandbox session."""

    state: SandbaseSandboxSessionState

    def __init__(self, *, state: SandbaseSandboxSessionState, sandbox: AsyncSandbox) -> None:
        self.state = state
        self._sandbox = sandbox
        self._processes = Processes(sandbox)

    @property
    def sandbox(self) -> AsyncSandbox:
        """The SDK's sandbox, for what the framework does not cover (egress, snapshots…)."""
        return self._sandbox

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        checked: Path = await self._validate_remote_path_access(path, for_write=for_write)
        return checked

    async def _prepare_backend_workspace(self) -> None:
        root = self._root()
        done = await self._run(["mkdir", "-p", "--", root], timeout=60, user=None)
        if done.exit_code != 0:
            raise WorkspaceStartError(path=Path(root), message=f"could not make {root}: {done.stderr!r}")

    def _root(self) -> str:
        root: str = self._workspace_root_path().as_posix()
        return root

    async def _env(self) -> dict[str, str]:
        resolved: dict[str, str] = await self.state.manifest.environment.resolve()
        return {**self.state.options.env, **resolved}

    def _prepare_exec_command(self, *command: str | Path, shell: bool | list[str], user: str | User | None) -> list[str]:
        # The user is SandBase's run-as, not sudo (which a sandbox does not have).
        argv: list[str] = super()._prepare_exec_command(*command, shell=shell, user=None)
        return argv

    async def exec(
        self, *command: str | Path, timeout: float | None = None, shell: bool | list[str] = True,
        user: str | User | None = None,
    ) -> ExecResult:
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        return await self._run(argv, timeout=timeout, user=_run_as(user))

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        return await self._run([str(part) for part in command], timeout=timeout, user=None)

    async def _run(self, argv: list[str], *, timeout: float | None, user: str | None) -> ExecResult:
        limit = timeout if timeout is not None else self.state.options.exec_timeout_secs
        try:
            done = await self._sandbox.commands.run(argv, cwd=self._root(), env=await self._env() or None,
                                                    timeout=max(limit, 0.001), user=user)
        except SandbaseError as error:
            raise ExecTransportError(command=tuple(argv), cause=error) from error
        if done.timed_out:
            raise ExecTimeoutError(command=tuple(argv), timeout_s=timeout)
        return ExecResult(stdout=done.stdout.encode(), stderr=done.stderr.encode(),
                          exit_code=done.exit_code if done.exit_code is not None else -1)

    async def read(self, path: Path | str, *, user: str | User | None = None) -> io.IOBase:
        if user is not None:
            checked = await self._check_read_with_exec(path, user=user)
        else:
            checked = await self._validate_path_access(path)
        try:
            return io.BytesIO(await self._sandbox.files.read(PurePosixPath(checked).as_posix()))
        except NotFound as error:
            raise WorkspaceReadNotFoundError(path=Path(str(path)), cause=error) from error
        except SandbaseError as error:
            raise WorkspaceArchiveReadError(path=Path(str(path)), cause=error) from error

    async def write(self, path: Path | str, data: io.IOBase, *, user: str | User | None = None) -> None:
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode()
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=Path(str(path)), actual_type=type(payload).__name__)
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        checked = await self._validate_path_access(path, for_write=True)
        try:
            await self._sandbox.files.write(PurePosixPath(checked).as_posix(), bytes(payload))
        except SandbaseError as error:
            raise WorkspaceArchiveWriteError(path=Path(str(path)), cause=error) from error

    async def running(self) -> bool:
        try:
            return (await self._sandbox.refresh()).state == "running"
        except SandbaseError:
            return False

    async def persist_workspace(self) -> io.IOBase:
        """The workspace as a tar stream from SandBase's archive API (the paths the manifest
        keeps out of snapshots left out)."""
        root = self._root()
        try:
            raw = await self._sandbox.files.archive(root)
        except SandbaseError as error:
            raise WorkspaceArchiveReadError(path=Path(root), cause=error) from error
        skipped = {path.as_posix() for path in self._persist_workspace_skip_relpaths()}
        return io.BytesIO(_without(raw, skipped) if skipped else raw)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Unpacks a tar stream into the workspace (refused when a member would land outside
        it)."""
        root = self._root()
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode()
        try:
            validate_tar_bytes(bytes(payload), allow_external_symlink_targets=False)
        except UnsafeTarMemberError as error:
            raise WorkspaceArchiveWriteError(
                path=Path(root), context={"reason": "unsafe_or_invalid_tar", "member": error.member}, cause=error,
            ) from error
        try:
            await self._sandbox.files.extract(root, bytes(payload))
        except SandbaseError as error:
            raise WorkspaceArchiveWriteError(path=Path(root), cause=error) from error

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self, *command: str | Path, timeout: float | None = None, shell: bool | list[str] = True,
        user: str | User | None = None, tty: bool = False, yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        if _run_as(user) == "root" and tty:
            raise ValueError("a terminal session runs as the sandbox's user; run root commands without tty")
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._processes.start(
            argv, cwd=self._root(), env=await self._env(), tty=tty, timeout=timeout, yield_ms=yield_ms,
            max_tokens=max_output_tokens,
        )

    async def pty_write_stdin(
        self, *, session_id: int, chars: str, yield_time_s: float | None = None, max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._processes.write(session_id, chars, yield_ms=yield_ms, max_tokens=max_output_tokens)

    async def pty_terminate_all(self) -> None:
        await self._processes.terminate_all()

    async def _shutdown_backend(self) -> None:
        await self._processes.terminate_all()
        try:
            await self._sandbox.destroy()
        except SandbaseError:
            pass  # gone already, or its own timeout ends it


class SandbaseSandboxClient(BaseSandboxClient[SandbaseSandboxClientOptions]):
    """Makes, resumes and deletes openai-agents sandbox sessions on SandBase
    (`SANDBASE_API_KEY` and `SANDBASE_URL`, or a client of the SDK)."""

    backend_id = "sandbase"
    supports_default_options = True

    def __init__(
        self, *, client: AsyncSandbase | None = None, instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self._client = client or AsyncSandbase()
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies

    async def create(
        self, *, snapshot: SnapshotSpec | SnapshotBase | None = None, manifest: Manifest | None = None,
        options: SandbaseSandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options or SandbaseSandboxClientOptions()
        manifest = manifest or Manifest(root=DEFAULT_WORKSPACE_ROOT)
        self._validate_manifest_for_create(manifest)
        sandbox = await self._new_sandbox(options)
        session_id = uuid.uuid4()
        state = SandbaseSandboxSessionState(
            session_id=session_id, manifest=manifest, snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_id=sandbox.id, options=options,
        )
        return self._wrap_session(SandbaseSandboxSession(state=state, sandbox=sandbox),
                                  instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, SandbaseSandboxSession):
            raise TypeError("SandbaseSandboxClient.delete expects a SandBase session")
        try:
            await inner.shutdown()
        except Exception:
            pass
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """The session's sandbox again while it runs; else a new one, which `start()` hydrates
        from the session's snapshot."""
        if not isinstance(state, SandbaseSandboxSessionState):
            raise TypeError("SandbaseSandboxClient.resume expects a SandbaseSandboxSessionState")
        state.assert_path_grants_rebound()
        sandbox: AsyncSandbox | None = None
        try:
            found = await AsyncSandbox.connect(state.sandbox_id, client=self._client)
            sandbox = found if found.info.state == "running" else None
        except NotFound:
            sandbox = None
        reconnected = sandbox is not None
        if sandbox is None:
            sandbox = await self._new_sandbox(state.options)
            state.sandbox_id = sandbox.id
            state.workspace_root_ready = False
        inner = SandbaseSandboxSession(state=state, sandbox=sandbox)
        inner._set_start_state_preserved(reconnected, system=reconnected)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, SandbaseSandboxSessionState)

    async def close(self) -> None:
        await self._client.close()

    async def _new_sandbox(self, options: SandbaseSandboxClientOptions) -> AsyncSandbox:
        return await AsyncSandbox.create(
            options.template, egress=options.egress or None, credentials=options.credentials or None,
            timeout=options.timeout_secs, cpu=options.cpu, memory_mb=options.memory_mb,
            env=options.env or None, store=options.store, isolation=options.isolation,
            metadata={"framework": "openai-agents"},
            client=self._client,
        )


def _run_as(user: str | User | None) -> str | None:
    """SandBase's run-as for the framework's user: the sandbox's user or root."""
    if user is None:
        return None
    name = user.name if isinstance(user, User) else str(user)
    if name not in RUN_AS:
        raise ValueError(f"a SandBase sandbox runs commands as `user` or `root`, not {name!r}")
    return name


def _without(raw: bytes, skipped: set[str]) -> bytes:
    """The tar archive `raw` without the members under the `skipped` relative paths."""
    kept = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as source, tarfile.open(fileobj=kept, mode="w") as target:
        for member in source:
            name = member.name.removeprefix("./").rstrip("/")
            if any(name == path or name.startswith(f"{path}/") for path in skipped):
                continue
            target.addfile(member, source.extractfile(member) if member.isfile() else None)
    return kept.getvalue()


__all__ = [
    "DEFAULT_WORKSPACE_ROOT", "SandbaseSandboxClient", "SandbaseSandboxClientOptions", "SandbaseSandboxSession",
    "SandbaseSandboxSessionState",
]
