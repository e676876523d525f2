"""The asynchronous client: `AsyncSandbase` and `AsyncSandbox`, the same surface as the
synchronous one with `await` (and `async with`, `async for`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from . import _core, models
from ._core import Call, CodeEvent, CommandEvent, Paths
from ._runs_async import AsyncAgentRuns

M = TypeVar("M", bound=BaseModel)


class _Http:
    """httpx with SandBase's key, retries on 429 and 503 (honouring `Retry-After`), and
    errors as exceptions."""

    def __init__(self, settings: _core.Settings, client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self.client = client or httpx.AsyncClient(base_url=settings.base_url, timeout=settings.timeout)

    async def send(self, call: Call, *, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            request = self.client.build_request(
                call.method,
                f"{self.settings.base_url}{call.path}",
                params=call.params,
                json=call.json,
                content=call.content,
                headers=_core.headers(self.settings, call),
                timeout=_core.request_timeout(self.settings, call),
            )
            response = await self.client.send(request, stream=stream)
            if response.is_success:
                return response
            body = await response.aread()
            await response.aclose()
            if _core.should_retry(response.status_code, attempt, self.settings):
                await asyncio.sleep(_core.backoff(attempt, _core.retry_after(response.headers.get("retry-after"))))
                attempt += 1
                continue
            raise _core.error(response.status_code, body, response.headers)

    async def model(self, call: Call, model: type[M]) -> M:
        return model.model_validate_json((await self.send(call)).content)

    async def close(self) -> None:
        await self.client.aclose()


class AsyncSandbase:
    """A SandBase client: `AsyncSandbase()` reads `SANDBASE_API_KEY` and `SANDBASE_URL`."""

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = 120.0,
        max_retries: int = 3,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._http = _Http(_core.settings(api_key, base_url, timeout, max_retries), http_client)
        self.agent_runs = AsyncAgentRuns(self._http)

    async def __aenter__(self) -> AsyncSandbase:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.close()

    async def call(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        """Any route of the API; the decoded JSON answer (None for 204)."""
        response = await self._http.send(Call(method, path, params=params, json=json))
        return response.json() if response.content else None

    # The team.
    async def me(self) -> models.Me:
        return await self._http.model(Call("GET", "/v1/me"), models.Me)

    async def sandboxes(self, state: str | None = None, limit: int | None = None) -> list[models.Sandbox]:
        params = _core.drop_none({"state": state, "limit": limit})
        return (await self._http.model(Call("GET", "/v1/sandboxes", params=params), models.SandboxList)).sandboxes

    async def templates(self) -> list[models.Template]:
        return (await self._http.model(Call("GET", "/v1/templates"), models.TemplateList)).templates

    async def keys(self) -> list[models.ApiKey]:
        return (await self._http.model(Call("GET", "/v1/api-keys"), models.ApiKeyList)).items

    async def create_key(self, name: str, **fields: Any) -> models.CreatedApiKey:
        body = _core.drop_none({"name": name, **fields})
        return await self._http.model(Call("POST", "/v1/api-keys", json=body), models.CreatedApiKey)

    async def revoke_key(self, key_id: str) -> None:
        await self._http.send(Call("DELETE", f"/v1/api-keys/{key_id}"))

    async def members(self) -> list[models.Member]:
        return (await self._http.model(Call("GET", "/v1/team/members"), models.MemberList)).items

    async def invite(self, email: str, role: str = "member") -> models.Invitation:
        call = Call("POST", "/v1/team/members", json={"email": email, "role": role})
        return await self._http.model(call, models.Invitation)

    async def balance(self) -> models.BalanceAnswer:
        return await self._http.model(Call("GET", "/v1/billing/balance"), models.BalanceAnswer)

    async def ledger(self, before: str | None = None, limit: int | None = None) -> models.LedgerPage:
        params = _core.drop_none({"before": before, "limit": limit})
        return await self._http.model(Call("GET", "/v1/billing/ledger", params=params), models.LedgerPage)

    async def usage(self, group_by: str = "day", **params: Any) -> models.UsageAnswer:
        query = _core.drop_none({"group_by": group_by, **params})
        return await self._http.model(Call("GET", "/v1/usage", params=query), models.UsageAnswer)

    async def audit(self, **filters: Any) -> models.AuditPage:
        return await self._http.model(Call("GET", "/v1/audit", params=_core.drop_none(filters)), models.AuditPage)

    async def secrets(self) -> list[models.Secret]:
        return (await self._http.model(Call("GET", "/v1/secrets"), models.SecretList)).secrets

    async def set_secret(self, name: str, value: str, hosts: list[str], header: str = "Authorization", format: str = "Bearer {value}") -> models.Secret:
        body = {"name": name, "value": value, "hosts": hosts, "inject": {"header": header, "format": format}}
        return await self._http.model(Call("POST", "/v1/secrets", json=body), models.Secret)

    async def run(self, cmd: str | list[str], **fields: Any) -> models.Run:
        body = _core.drop_none({"command" if isinstance(cmd, str) else "cmd": cmd, **fields})
        return await self._http.model(Call("POST", "/v1/runs", json=body), models.Run)

    async def get_run(self, run_id: str) -> models.Run:
        return await self._http.model(Call("GET", f"/v1/runs/{run_id}"), models.Run)

    async def store_models(self) -> list[models.StoreModel]:
        return (await self._http.model(Call("GET", "/v1/store/models"), models.StoreModelList)).models


class AsyncSandbox:
    """A sandbox: `with Sandbox.create() as sbx:` destroys it on leaving the block."""

    def __init__(self, client: AsyncSandbase, info: models.Sandbox, owns_client: bool = False) -> None:
        self.client = client
        self.info = info
        self.id = str(info.id)
        self._paths = Paths(self.id)
        self._owns_client = owns_client
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.egress = AsyncEgress(self)
        self.pty = AsyncPty(self)
        self.code = AsyncCode(self)

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        *,
        egress: list[str] | None = None,
        credentials: list[str] | None = None,
        timeout: float | None = None,
        cpu: float | None = None,
        memory_mb: int | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        store: bool = False,
        snapshot: str | None = None,
        isolation: str | None = None,
        client: AsyncSandbase | None = None,
    ) -> AsyncSandbox:
        """A new sandbox (`timeout` in seconds; `egress` the hosts it may reach; `isolation`
        `runc` or `gvisor`, the deployment's default when unset)."""
        owner = client or AsyncSandbase()
        body = _core.create_body(
            template, egress=egress, credentials=credentials, timeout=timeout, cpu=cpu,
            memory_mb=memory_mb, env=env, metadata=metadata, store=store, snapshot=snapshot,
            isolation=isolation,
        )
        info = await owner._http.model(Call("POST", "/v1/sandboxes", json=body), models.Sandbox)
        return cls(owner, info, owns_client=client is None)

    @classmethod
    async def connect(cls, sandbox_id: str, client: AsyncSandbase | None = None) -> AsyncSandbox:
        owner = client or AsyncSandbase()
        info = await owner._http.model(Call("GET", f"/v1/sandboxes/{sandbox_id}"), models.Sandbox)
        return cls(owner, info, owns_client=client is None)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None) -> None:
        await self.destroy()

    async def _send(self, call: Call, *, stream: bool = False) -> httpx.Response:
        return await self.client._http.send(call, stream=stream)

    async def _model(self, call: Call, model: type[M]) -> M:
        return await self.client._http.model(call, model)

    async def refresh(self) -> models.Sandbox:
        self.info = await self._model(Call("GET", self._paths.of()), models.Sandbox)
        return self.info

    async def extend(self, seconds: float) -> models.Sandbox:
        """Sets the sandbox to expire `seconds` from now."""
        call = Call("POST", self._paths.of("/timeout"), json={"timeout_secs": int(seconds)})
        self.info = await self._model(call, models.Sandbox)
        return self.info

    async def snapshot(self) -> models.Snapshot:
        """Its `/work` and `/tmp` kept; `Sandbox.create(snapshot=…)` starts from them."""
        return await self._model(Call("POST", self._paths.of("/snapshots"), json={}), models.Snapshot)

    async def destroy(self) -> None:
        try:
            await self._send(Call("DELETE", self._paths.of()))
        finally:
            if self._owns_client:
                await self.client.close()


class AsyncCommands:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def run(
        self,
        cmd: str | list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
        session: str | None = None,
        user: str | None = None,
        exec_id: str | None = None,
    ) -> models.ExecResult:
        """Runs `cmd` (a shell line, or an argv) to its end: exit code, stdout, stderr. `user`
        is `user` (the default) or `root`; a named command (`exec_id`) runs to its end even
        when the connection drops."""
        body = _core.exec_body(cmd, cwd=cwd, env=env, timeout=timeout, stdin=stdin, session=session,
                               user=user, exec_id=exec_id)
        return await self._sandbox._model(_core.exec_call(self._sandbox._paths.of("/exec"), body, timeout), models.ExecResult)

    async def stream(
        self,
        cmd: str | list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | None = None,
        exec_id: str | None = None,
    ) -> AsyncIterator[CommandEvent]:
        """Runs `cmd`, yielding its output as it comes, then its exit."""
        body = _core.exec_body(cmd, cwd=cwd, env=env, timeout=timeout, stdin=None, session=None, stream=True,
                               user=user, exec_id=exec_id)
        response = await self._sandbox._send(Call("POST", self._sandbox._paths.of("/exec"), json=body), stream=True)
        try:
            async for line in response.aiter_lines():
                if line.strip():
                    yield _core.command_event(line)
        finally:
            await response.aclose()

    async def cancel(self, exec_id: str) -> None:
        """Interrupts the named command (SIGINT, then SIGKILL to its process group a second
        later)."""
        await self._sandbox._send(Call("POST", self._sandbox._paths.of(f"/execs/{exec_id}/cancel")))

    async def start(
        self,
        cmd: str | list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> AsyncProcess:
        """Starts `cmd` in the background: a `AsyncProcess` to feed, signal and wait for."""
        body = _core.exec_body(cmd, cwd=cwd, env=env, timeout=timeout, stdin=None, session=None, background=True)
        started = await self._sandbox._model(Call("POST", self._sandbox._paths.of("/exec"), json=body), models.BackgroundStarted)
        return AsyncProcess(self._sandbox, started.pid)

    async def list(self) -> list[models.Process]:
        return (await self._sandbox._model(Call("GET", self._sandbox._paths.of("/processes")), models.ProcessList)).processes


class AsyncProcess:
    """A background process."""

    def __init__(self, sandbox: AsyncSandbox, pid: int) -> None:
        self._sandbox = sandbox
        self.pid = pid
        self._path = sandbox._paths.of(f"/processes/{pid}")

    async def info(self) -> models.Process:
        return await self._sandbox._model(Call("GET", self._path), models.Process)

    async def send_stdin(self, data: str | bytes, *, close: bool = False) -> None:
        content = data.encode() if isinstance(data, str) else data
        call = Call("POST", f"{self._path}/stdin", params={"close": "true"} if close else None,
                    content=content, content_type="application/octet-stream")
        await self._sandbox._send(call)

    async def signal(self, signal: str | int = "TERM") -> None:
        await self._sandbox._send(Call("POST", f"{self._path}/signal", json={"signal": signal}))

    async def wait(self, timeout: float = 60.0, poll: float = 0.1) -> models.Process:
        """Its state once it has exited (polling), or TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            info = await self.info()
            if not info.running:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"process {self.pid} still running after {timeout} s")
            await asyncio.sleep(poll)


class AsyncFiles:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox
        self._path = sandbox._paths.of("/files")

    async def read(self, path: str) -> bytes:
        return (await self._sandbox._send(Call("GET", self._path, params={"path": path}))).content

    async def read_text(self, path: str) -> str:
        return (await self.read(path)).decode()

    async def write(self, path: str, data: str | bytes) -> models.FileInfo:
        content = data.encode() if isinstance(data, str) else data
        call = Call("PUT", self._path, params={"path": path}, content=content, content_type="application/octet-stream")
        return await self._sandbox._model(call, models.FileInfo)

    async def list(self, path: str = "/work") -> list[models.FileInfo]:
        return (await self._sandbox._model(Call("GET", self._path, params={"path": path}), models.DirectoryListing)).entries

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._sandbox._send(Call("DELETE", self._path, params={"path": path, "recursive": str(recursive).lower()}))

    async def upload(self, local: str | Path, path: str) -> models.FileInfo:
        return await self.write(path, Path(local).read_bytes())

    async def download(self, path: str, local: str | Path) -> Path:
        target = Path(local)
        target.write_bytes(await self.read(path))
        return target

    async def archive(self, path: str = "/work") -> bytes:
        """`path` as a tar archive."""
        return (await self._sandbox._send(Call("GET", self._sandbox._paths.of("/archive"), params={"path": path}))).content

    async def extract(self, path: str, tar: bytes) -> None:
        """Unpacks a tar archive into `path`."""
        call = Call("PUT", self._sandbox._paths.of("/archive"), params={"path": path}, content=tar, content_type="application/x-tar")
        await self._sandbox._send(call)


class AsyncCode:
    """Python in stateful contexts of the sandbox: variables, imports and the working
    directory live on from one call to the next (`default` unless a context is named)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox
        self._path = sandbox._paths.of("/code")

    async def run(self, code: str, *, context: str | None = None, timeout: float | None = None) -> models.CodeResult:
        """Runs `code` to its end: stdout, stderr, its results (`main`: the last expression's
        value), the exception it raised. Past `timeout` seconds it is interrupted, the
        context kept."""
        call = _core.code_call(self._path, code, context=context, timeout=timeout, stream=False)
        return await self._sandbox._model(call, models.CodeResult)

    async def stream(
        self, code: str, *, context: str | None = None, timeout: float | None = None
    ) -> AsyncIterator[CodeEvent]:
        """Runs `code`, yielding its output and results as they come, `done` last."""
        call = _core.code_call(self._path, code, context=context, timeout=timeout, stream=True)
        response = await self._sandbox._send(call, stream=True)
        try:
            async for line in response.aiter_lines():
                if line.strip():
                    yield _core.code_event(line)
        finally:
            await response.aclose()

    async def create_context(
        self, *, cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None
    ) -> models.CodeContext:
        """A context of its own (an interpreter with its directory, environment and user)."""
        body = _core.context_body(cwd, env, user)
        return await self._sandbox._model(Call("POST", f"{self._path}/contexts", json=body), models.CodeContext)

    async def contexts(self) -> list[models.CodeContext]:
        answer = await self._sandbox._model(Call("GET", f"{self._path}/contexts"), models.CodeContextList)
        return answer.contexts

    async def delete_context(self, context: str) -> None:
        await self._sandbox._send(Call("DELETE", f"{self._path}/contexts/{context}"))

    async def interrupt(self, context: str = "default") -> None:
        """KeyboardInterrupt in what the context runs; its variables are kept."""
        await self._sandbox._send(Call("POST", f"{self._path}/contexts/{context}/interrupt"))


class AsyncEgress:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def policy(self) -> models.EgressPolicy:
        return await self._sandbox._model(Call("GET", self._sandbox._paths.of("/egress-policy")), models.EgressPolicy)

    async def set_policy(self, allow: list[str], deny: list[str] | None = None) -> models.EgressPolicy:
        call = Call("PUT", self._sandbox._paths.of("/egress-policy"), json={"allow": allow, "deny": deny or []})
        return await self._sandbox._model(call, models.EgressPolicy)

    async def flows(self) -> list[models.EgressFlow]:
        return (await self._sandbox._model(Call("GET", self._sandbox._paths.of("/egress")), models.EgressFlowList)).flows


class AsyncPty:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def create(self, *, cols: int = 80, rows: int = 24, cmd: list[str] | None = None, record: bool = True) -> AsyncTerminal:
        body = _core.drop_none({"cols": cols, "rows": rows, "cmd": cmd, "record": record})
        info = await self._sandbox._model(Call("POST", self._sandbox._paths.of("/pty"), json=body), models.Terminal)
        return AsyncTerminal(self._sandbox, info)

    async def list(self) -> list[models.Terminal]:
        return (await self._sandbox._model(Call("GET", self._sandbox._paths.of("/pty")), models.TerminalList)).terminals


class AsyncTerminal:
    """A terminal session: type into it, resize it, read (attach to) its output."""

    def __init__(self, sandbox: AsyncSandbox, info: models.Terminal) -> None:
        self._sandbox = sandbox
        self.info = info
        self.session_id = info.session_id
        self._path = sandbox._paths.of(f"/pty/{info.session_id}")

    async def send(self, data: str | bytes) -> None:
        content = data.encode() if isinstance(data, str) else data
        await self._sandbox._send(Call("POST", f"{self._path}/input", content=content, content_type="application/octet-stream"))

    async def resize(self, cols: int, rows: int) -> None:
        await self._sandbox._send(Call("POST", f"{self._path}/resize", json={"cols": cols, "rows": rows}))

    async def attach(self, since: int = 0) -> AsyncIterator[bytes]:
        """Its output from offset `since` as it comes, until the session ends."""
        response = await self._sandbox._send(Call("GET", f"{self._path}/output", params={"since": since}), stream=True)
        try:
            async for chunk in response.aiter_bytes():
                yield chunk
        finally:
            await response.aclose()

    async def refresh(self) -> models.Terminal:
        self.info = await self._sandbox._model(Call("GET", self._path), models.Terminal)
        return self.info

    async def close(self) -> None:
        await self._sandbox._send(Call("DELETE", self._path))
