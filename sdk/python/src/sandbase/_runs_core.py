"""What the sync and async agent-run resources share: the calls as data, the inputs' bodies,
Server-Sent Events read into events, and when to reconnect. No I/O here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from . import models
from ._core import Call, drop_none

BASE = "/v1/agent-runs"
# Where a run stands once it is not being stepped: it waits for its client, or it ended.
STOPPED = frozenset({"idle", "requires_action", "completed", "failed", "cancelled", "limited"})
FINAL = frozenset({"completed", "failed", "cancelled", "limited"})


def path(run_id: str, tail: str = "") -> str:
    return f"{BASE}/{run_id}{tail}"


def create_call(fields: Mapping[str, Any], idempotency_key: str | None) -> Call:
    """A new run: `fields` are `POST /v1/agent-runs`'s body (`model`, `input`, `tools`…)."""
    return Call("POST", BASE, json=drop_none(dict(fields)), headers=_idempotent(idempotency_key))


def input_call(run_id: str, body: Mapping[str, Any], idempotency_key: str | None) -> Call:
    return Call("POST", path(run_id, "/inputs"), json=drop_none(dict(body)), headers=_idempotent(idempotency_key))


def message(content: str) -> dict[str, Any]:
    return {"type": "message", "content": content}


def tool_result(call_id: str, output: str, is_error: bool) -> dict[str, Any]:
    return {"type": "tool_result", "call_id": call_id, "output": output, "is_error": is_error or None}


def decision(call_id: str, allow: bool, reason: str | None, remember: str | None) -> dict[str, Any]:
    return {"type": "approval", "call_id": call_id, "decision": "allow" if allow else "deny",
            "reason": reason, "remember": remember}


def limits(values: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "limits", "limits": drop_none(dict(values))}


def cancel_call(run_id: str, scope: str, call_id: str | None) -> Call:
    return Call("POST", path(run_id, "/cancel"), json=drop_none({"scope": scope, "call_id": call_id}))


def page_call(run_id: str, after: int) -> Call:
    return Call("GET", path(run_id, "/events"), params={"after": after, "limit": 1000})


def stream_call(run_id: str, after: int) -> Call:
    """The run's events after `after` as Server-Sent Events (`Last-Event-ID` says where to
    resume); the request may wait for an event as long as the run goes on."""
    headers = {"accept": "text/event-stream", "last-event-id": str(after)}
    return Call("GET", path(run_id, "/events"), params={"after": after}, headers=headers, timeout=24 * 3600.0)


def sse_events(lines: Iterable[str]) -> Iterable[models.AgentRunEvent]:
    """The events of a Server-Sent Events stream, frame by frame (its `data` lines)."""
    frames = Frames()
    for line in lines:
        event = frames.feed(line)
        if event is not None:
            yield event


class Frames:
    """Server-Sent Events lines fed one at a time (the async client's), events out."""

    def __init__(self) -> None:
        self.data: list[str] = []

    def feed(self, line: str) -> models.AgentRunEvent | None:
        if line == "":
            event = models.AgentRunEvent.model_validate(json.loads("\n".join(self.data))) if self.data else None
            self.data = []
            return event
        if line.startswith("data:"):
            self.data.append(line[5:].removeprefix(" "))
        return None


def _idempotent(key: str | None) -> dict[str, str] | None:
    return {"idempotency-key": key} if key else None
