"""What the sync and async clients share: the calls of the API as data, configuration,
retries and how answers become results or exceptions. No I/O here."""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from .errors import SandbaseError, error_for

DEFAULT_URL = "http://127.0.0.1:8080"
# Answers worth asking again: the request was not carried out (rate limit, busy).
RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Call:
    """One request of the API."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    content_type: str | None = None
    # Seconds this request may wait for its answer, when longer than the client's own.
    timeout: float | None = None
    # Headers of this request besides the key's (`idempotency-key`, `last-event-id`).
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Settings:
    api_key: str
    base_url: str
    timeout: float
    max_retries: int


def settings(
    api_key: str | None, base_url: str | None, timeout: float, max_retries: int
) -> Settings:
    """Explicit arguments first, then `SANDBASE_API_KEY` and `SANDBASE_URL`."""
    key = api_key or os.environ.get("SANDBASE_API_KEY")
    if not key:
        raise ValueError("no API key: pass api_key= or set SANDBASE_API_KEY")
    url = (base_url or os.environ.get("SANDBASE_URL") or DEFAULT_URL).rstrip("/")
    return Settings(api_key=key, base_url=url, timeout=timeout, max_retries=max_retries)


def headers(settings: Settings, call: Call) -> dict[str, str]:
    answer = {"authorization": f"Bearer {settings.api_key}", "user-agent": "sandbase-python/0.1.0"}
    if call.content_type:
        answer["content-type"] = call.content_type
    if call.headers:
        answer.update(call.headers)
    return answer


def request_timeout(settings: Settings, call: Call) -> float:
    """How long a request waits: the client's timeout, or the call's when longer."""
    return max(settings.timeout, call.timeout or 0.0)


def retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds (the API sends seconds)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def should_retry(status: int, attempt: int, settings: Settings) -> bool:
    return status in RETRY_STATUSES and attempt < settings.max_retries


def backoff(attempt: int, asked: float | None) -> float:
    """How long to wait before attempt `attempt + 1`: what the server asked, else
    exponential back-off with jitter (0.25 s, 0.5 s, 1 s … at most 8 s)."""
    if asked is not None:
        return min(asked, 60.0)
    return float(min(8.0, 0.25 * 2**attempt) * (0.5 + random.random() / 2))


def error(status: int, body: bytes, response_headers: Mapping[str, str]) -> SandbaseError:
    """The exception for an error answer (`{"error":{"code","message","request_id"}}`)."""
    code, message, request_id = f"http_{status}", body.decode("utf-8", "replace")[:500], None
    try:
        detail = json.loads(body)["error"]
        code, message = str(detail["code"]), str(detail["message"])
        request_id = detail.get("request_id")
    except (ValueError, KeyError, TypeError):
        pass
    request_id = request_id or response_headers.get("x-request-id")
    return error_for(status, code, message, request_id, retry_after(response_headers.get("retry-after")))


@dataclass(frozen=True)
class CommandEvent:
    """One line of a streamed command: its `pid`, a chunk of `stdout` or `stderr`, or its
    `exit`."""

    kind: Literal["pid", "stdout", "stderr", "exit"]
    pid: int | None = None
    text: str = ""
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    duration_ms: int | None = None


def command_event(line: str) -> CommandEvent:
    """A streamed command's NDJSON line; an `error` line raises it."""
    event: dict[str, Any] = json.loads(line)
    if "error" in event:
        detail = event["error"]
        raise error_for(500, str(detail.get("code")), str(detail.get("message")), detail.get("request_id"))
    if "pid" in event and "exit_code" not in event:
        return CommandEvent("pid", pid=int(event["pid"]))
    if "stdout" in event:
        return CommandEvent("stdout", text=str(event["stdout"]))
    if "stderr" in event:
        return CommandEvent("stderr", text=str(event["stderr"]))
    return CommandEvent(
        "exit",
        exit_code=event.get("exit_code"),
        signal=event.get("signal"),
        timed_out=bool(event.get("timed_out")),
        duration_ms=event.get("duration_ms"),
    )


def drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class Paths:
    """The routes of one sandbox."""

    id: str
    base: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", f"/v1/sandboxes/{self.id}")

    def of(self, tail: str = "") -> str:
        return f"{self.base}{tail}"


def exec_body(
    cmd: str | list[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    timeout: float | None,
    stdin: str | None,
    session: str | None,
    stream: bool = False,
    background: bool = False,
    exec_id: str | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """`cmd` as a shell command line (a string) or an argv (a list)."""
    body = drop_none(
        {
            "cwd": cwd,
            "env": dict(env) if env else None,
            "timeout_secs": max(1, math.ceil(timeout)) if timeout is not None else None,
            "stdin": stdin,
            "session": session,
            "exec_id": exec_id,
            "user": user,
        }
    )
    body["command" if isinstance(cmd, str) else "cmd"] = cmd
    if stream:
        body["stream"] = True
    if background:
        body["background"] = True
    return body


def exec_call(path: str, body: dict[str, Any], timeout: float | None) -> Call:
    """A command run to its end: the request waits for it past its own timeout."""
    return Call("POST", path, json=body, timeout=timeout + CODE_MARGIN_SECS if timeout is not None else None)


def create_body(
    template: str | None,
    *,
    egress: list[str] | None,
    credentials: list[str] | None,
    timeout: float | None,
    cpu: float | None,
    memory_mb: int | None,
    env: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    store: bool,
    snapshot: str | None,
    isolation: str | None = None,
) -> dict[str, Any]:
    resources = drop_none({"cpu": cpu, "memory_mb": memory_mb})
    return drop_none(
        {
            "template": template,
            "egress": {"allow": egress} if egress else None,
            "credentials": credentials or None,
            "timeout_secs": int(timeout) if timeout is not None else None,
            "resources": resources or None,
            "env": dict(env) if env else None,
            "metadata": dict(metadata) if metadata else None,
            "store": store or None,
            "snapshot": snapshot,
            "isolation": isolation,
        }
    )


# What a code call may take when it names no `timeout_secs` (the API's default), and the
# margin the HTTP request waits past it for the answer.
CODE_DEFAULT_SECS = 300
CODE_MARGIN_SECS = 30.0


def code_call(path: str, code: str, *, context: str | None, timeout: float | None, stream: bool) -> Call:
    """A run of `code` in a context (`default` when none is named)."""
    body = drop_none(
        {"code": code, "context": context, "timeout_secs": int(timeout) if timeout is not None else None}
    )
    if stream:
        body["stream"] = True
    waits = (timeout if timeout is not None else CODE_DEFAULT_SECS) + CODE_MARGIN_SECS
    return Call("POST", path, json=body, timeout=waits)


def context_body(cwd: str | None, env: Mapping[str, str] | None, user: str | None) -> dict[str, Any]:
    return drop_none({"cwd": cwd, "env": dict(env) if env else None, "user": user})


@dataclass(frozen=True)
class CodeEvent:
    """One line of a streamed code call: a chunk of `stdout` or `stderr`, a `result` (the
    last expression's value has `main`), an `exception`, and `done` last."""

    kind: Literal["stdout", "stderr", "result", "exception", "done"]
    text: str = ""
    data: Mapping[str, str] = field(default_factory=dict)
    main: bool = False
    exception: Mapping[str, str] | None = None
    done: Mapping[str, Any] | None = None


def code_event(line: str) -> CodeEvent:
    """A streamed code call's NDJSON line; an `error` line (the context broke) raises it."""
    event: dict[str, Any] = json.loads(line)
    if "error" in event:
        detail = event["error"]
        raise error_for(500, str(detail.get("code")), str(detail.get("message")), detail.get("request_id"))
    if "stdout" in event:
        return CodeEvent("stdout", text=str(event["stdout"]))
    if "stderr" in event:
        return CodeEvent("stderr", text=str(event["stderr"]))
    if "result" in event:
        return CodeEvent("result", data=dict(event["result"]), main=bool(event.get("main")))
    if "exception" in event:
        return CodeEvent("exception", exception=dict(event["exception"]))
    return CodeEvent("done", done=dict(event.get("done") or {}))
