"""Agent runs with the synchronous client: `client.agent_runs`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import httpx

from . import _runs_core, models
from ._core import Call
from .errors import RateLimited, ServiceUnavailable

if TYPE_CHECKING:
    from ._sync import _Http

# What a dropped stream is retried after: a transport failure, a gateway going away.
RESUMABLE = (httpx.TransportError, ServiceUnavailable, RateLimited)


class AgentRuns:
    """The team's agent runs: the harness's loop on any store model with SandBase's tools."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    def create(self, *, model: str, input: str | list[Any], idempotency_key: str | None = None,
               **fields: Any) -> models.AgentRun:
        """A new run (`tools`, `instructions`, `sandbox`, `limits`, `approvals`, `metadata`…
        as `POST /v1/agent-runs` takes them); a retried create with the same
        `idempotency_key` answers the first run."""
        call = _runs_core.create_call({"model": model, "input": input, **fields}, idempotency_key)
        return self._http.model(call, models.AgentRun)

    def get(self, run_id: str) -> models.AgentRun:
        return self._http.model(Call("GET", _runs_core.path(run_id)), models.AgentRun)


    def steps(self, run_id: str) -> list[models.AgentRunStep]:
        return self._http.model(Call("GET", _runs_core.path(run_id, "/steps")), models.AgentRunStepList).steps

    def turns(self, run_id: str) -> list[models.AgentRunTurn]:
        return self._http.model(Call("GET", _runs_core.path(run_id, "/turns")), models.AgentRunTurnList).turns

    def delete(self, run_id: str) -> None:
        self._http.send(Call("DELETE", _runs_core.path(run_id)))

    def send(self, run_id: str, content: str, *, idempotency_key: str | None = None) -> models.AgentRun:
        """A message: the next turn's input (queued while a turn goes on)."""
        return self._input(run_id, _runs_core.message(content), idempotency_key)

    def submit_tool_result(self, run_id: str, call_id: str, output: str, *, is_error: bool = False,
                           idempotency_key: str | None = None) -> models.AgentRun:
        """The result of a client function the run waits for."""
        return self._input(run_id, _runs_core.tool_result(call_id, output, is_error), idempotency_key)

    def approve(self, run_id: str, call_id: str, *, remember: str | None = None,
                reason: str | None = None) -> models.AgentRun:
        """Lets the call run (`remember="run"`: and the same tool and rule for the rest of
        the run)."""
        return self._input(run_id, _runs_core.decision(call_id, True, reason, remember), None)

    def deny(self, run_id: str, call_id: str, *, reason: str | None = None) -> models.AgentRun:
        """Refuses the call: the model is told, with `reason`."""
        return self._input(run_id, _runs_core.decision(call_id, False, reason, None), None)

    def set_limits(self, run_id: str, **limits: Any) -> models.AgentRun:
        """New limits for a run waiting at one (`max_credits`, `max_turns`…)."""
        return self._input(run_id, _runs_core.limits(limits), None)

    def cancel(self, run_id: str, scope: str = "run", *, call_id: str | None = None) -> models.AgentRun:
        """`run` ends it, `turn` ends the turn going on, `tool` (with `call_id`) that call."""
        return self._http.model(_runs_core.cancel_call(run_id, scope, call_id), models.AgentRun)

    def events(self, run_id: str, *, after: int = 0, follow: bool = True,
               reconnect_for: float = 120.0) -> Iterator[models.AgentRunEvent]:
        """The run's events after `after`, each `seq` once: followed live until the run ends
        (`follow`), resuming by itself from the last event seen (`Last-Event-ID`) when the
        connection drops — for up to `reconnect_for` seconds without an answer — else the
        journal as it is now."""
        if not follow:
            yield from self._pages(run_id, after)
            return
        last, failing_since = after, None
        while True:
            try:
                response = self._http.send(_runs_core.stream_call(run_id, last), stream=True)
                try:
                    for event in _runs_core.sse_events(response.iter_lines()):
                        failing_since = None
                        if event.seq > last:
                            last = event.seq
                            yield event
                finally:
                    response.close()
                return
            except RESUMABLE:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > reconnect_for:
                    raise
                time.sleep(0.25)

    def wait(self, run_id: str, *, until: Iterable[str] | None = None, timeout: float = 600.0,
             poll: float = 0.25) -> models.AgentRun:
        """The run once it stopped being stepped — idle, waiting for an action, or ended —
        or TimeoutError."""
        stopped = set(until or _runs_core.STOPPED)
        deadline = time.monotonic() + timeout
        while True:
            run = self.get(run_id)
            if run.status in stopped:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"agent run {run_id} is still {run.status} after {timeout} s")
            time.sleep(poll)

    def list(self) -> list[models.AgentRun]:
        return self._http.model(Call("GET", _runs_core.BASE), models.AgentRunList).agent_runs

    def _pages(self, run_id: str, after: int) -> Iterator[models.AgentRunEvent]:
        while True:
            page = self._http.model(_runs_core.page_call(run_id, after), models.AgentRunEventPage)
            yield from page.events
            if not page.has_more or not page.events:
                return
            after = page.events[-1].seq

    def _input(self, run_id: str, body: dict[str, Any], idempotency_key: str | None) -> models.AgentRun:
        return self._http.model(_runs_core.input_call(run_id, body, idempotency_key), models.AgentRun)


__all__ = ["AgentRuns"]
