"""Agent runs with the asynchronous client: `client.agent_runs`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import httpx

from . import _runs_core, models
from ._core import Call
from .errors import RateLimited, ServiceUnavailable

if TYPE_CHECKING:
    from ._async import _Http

# What a dropped stream is retried after: a transport failure, a gateway going away.
RESUMABLE = (httpx.TransportError, ServiceUnavailable, RateLimited)


class AsyncAgentRuns:
    """The team's agent runs: the harness's loop on any store model with SandBase's tools."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def create(self, *, model: str, input: str | list[Any], idempotency_key: str | None = None,
                     **fields: Any) -> models.AgentRun:
        """A new run (`tools`, `instructions`, `sandbox`, `limits`, `approvals`, `metadata`…
        as `POST /v1/agent-runs` takes them); a retried create with the same
        `idempotency_key` answers the first run."""
        call = _runs_core.create_call({"model": model, "input": input, **fields}, idempotency_key)
        return await self._http.model(call, models.AgentRun)

    async def get(self, run_id: str) -> models.AgentRun:
        return await self._http.model(Call("GET", _runs_core.path(run_id)), models.AgentRun)


    async def steps(self, run_id: str) -> list[models.AgentRunStep]:
        return (await self._http.model(Call("GET", _runs_core.path(run_id, "/steps")), models.AgentRunStepList)).steps

    async def turns(self, run_id: str) -> list[models.AgentRunTurn]:
        return (await self._http.model(Call("GET", _runs_core.path(run_id, "/turns")), models.AgentRunTurnList)).turns

    async def delete(self, run_id: str) -> None:
        await self._http.send(Call("DELETE", _runs_core.path(run_id)))

    async def send(self, run_id: str, content: str, *, idempotency_key: str | None = None) -> models.AgentRun:
        """A message: the next turn's input (queued while a turn goes on)."""
        return await self._input(run_id, _runs_core.message(content), idempotency_key)

    async def submit_tool_result(self, run_id: str, call_id: str, output: str, *, is_error: bool = False,
                                 idempotency_key: str | None = None) -> models.AgentRun:
        """The result of a client function the run waits for."""
        return await self._input(run_id, _runs_core.tool_result(call_id, output, is_error), idempotency_key)

    async def approve(self, run_id: str, call_id: str, *, remember: str | None = None,
                      reason: str | None = None) -> models.AgentRun:
        """Lets the call run (`remember="run"`: and the same tool and rule for the rest of
        the run)."""
        return await self._input(run_id, _runs_core.decision(call_id, True, reason, remember), None)

    async def deny(self, run_id: str, call_id: str, *, reason: str | None = None) -> models.AgentRun:
        """Refuses the call: the model is told, with `reason`."""
        return await self._input(run_id, _runs_core.decision(call_id, False, reason, None), None)

    async def set_limits(self, run_id: str, **limits: Any) -> models.AgentRun:
        """New limits for a run waiting at one (`max_credits`, `max_turns`…)."""
        return await self._input(run_id, _runs_core.limits(limits), None)

    async def cancel(self, run_id: str, scope: str = "run", *, call_id: str | None = None) -> models.AgentRun:
        """`run` ends it, `turn` ends the turn going on, `tool` (with `call_id`) that call."""
        return await self._http.model(_runs_core.cancel_call(run_id, scope, call_id), models.AgentRun)

    async def events(self, run_id: str, *, after: int = 0, follow: bool = True,
                     reconnect_for: float = 120.0) -> AsyncIterator[models.AgentRunEvent]:
        """The run's events after `after`, each `seq` once: followed live until the run ends
        (`follow`), resuming by itself from the last event seen (`Last-Event-ID`) when the
        connection drops — for up to `reconnect_for` seconds without an answer — else the
        journal as it is now."""
        if not follow:
            async for event in self._pages(run_id, after):
                yield event
            return
        last, failing_since = after, None
        while True:
            try:
                response = await self._http.send(_runs_core.stream_call(run_id, last), stream=True)
                frames = _runs_core.Frames()
                try:
                    async for line in response.aiter_lines():
                        framed = frames.feed(line)
                        if framed is None:
                            continue
                        failing_since = None
                        if framed.seq > last:
                            last = framed.seq
                            yield framed
                finally:
                    await response.aclose()
                return
            except RESUMABLE:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > reconnect_for:
                    raise
                await asyncio.sleep(0.25)

    async def wait(self, run_id: str, *, until: Iterable[str] | None = None, timeout: float = 600.0,
                   poll: float = 0.25) -> models.AgentRun:
        """The run once it stopped being stepped — idle, waiting for an action, or ended —
        or TimeoutError."""
        stopped = set(until or _runs_core.STOPPED)
        deadline = time.monotonic() + timeout
        while True:
            run = await self.get(run_id)
            if run.status in stopped:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"agent run {run_id} is still {run.status} after {timeout} s")
            await asyncio.sleep(poll)

    async def list(self) -> list[models.AgentRun]:
        return (await self._http.model(Call("GET", _runs_core.BASE), models.AgentRunList)).agent_runs

    async def _pages(self, run_id: str, after: int) -> AsyncIterator[models.AgentRunEvent]:
        while True:
            page = await self._http.model(_runs_core.page_call(run_id, after), models.AgentRunEventPage)
            for event in page.events:
                yield event
            if not page.has_more or not page.events:
                return
            after = page.events[-1].seq

    async def _input(self, run_id: str, body: dict[str, Any], idempotency_key: str | None) -> models.AgentRun:
        return await self._http.model(_runs_core.input_call(run_id, body, idempotency_key), models.AgentRun)


__all__ = ["AsyncAgentRuns"]
