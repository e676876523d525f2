"""The interactive processes of an openai-agents sandbox session on SandBase: a command with a
TTY runs in a SandBase terminal session (its output read by attaching, its input typed into
it), one without in a named command (`exec_id`) streamed as it prints and interrupted by name.
Each is known to the model by a process id of the framework's range."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .._async import AsyncSandbox, AsyncTerminal

try:
    from agents.sandbox.errors import ExecTransportError, PtySessionNotFoundError
    from agents.sandbox.session.pty_output import collect_pty_output
    from agents.sandbox.session.pty_types import (
        PTY_PROCESSES_MAX,
        PtyExecUpdate,
        allocate_pty_process_id,
        clamp_pty_yield_time_ms,
        process_id_to_prune_from_meta,
        resolve_pty_write_yield_time_ms,
    )
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError("openai-agents is not installed: pip install 'sandbase[openai-agents]'") from missing


@dataclass
class Interactive:
    """One process: its output as it comes, whether it ended and how."""

    terminal: AsyncTerminal | None = None
    exec_id: str | None = None
    chunks: deque[bytes] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    last_used: float = field(default_factory=time.monotonic)
    reader: asyncio.Task[None] | None = None

    async def add(self, data: bytes) -> None:
        async with self.lock:
            self.chunks.append(data)
        self.notify.set()

    def end(self, exit_code: int | None) -> None:
        if exit_code is not None:
            self.exit_code = exit_code
        self.closed.set()
        self.notify.set()


class Processes:
    """The session's interactive processes, by the framework's process ids."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self.sandbox = sandbox
        self.lock = asyncio.Lock()
        self.running: dict[int, Interactive] = {}
        self.reserved: set[int] = set()

    async def start(self, argv: list[str], *, cwd: str, env: dict[str, str], tty: bool,
                    timeout: float | None, yield_ms: int, max_tokens: int | None) -> PtyExecUpdate:
        try:
            entry = await (self._terminal(argv, cwd, env) if tty else self._command(argv, cwd, env, timeout))
        except Exception as error:
            raise ExecTransportError(command=tuple(argv), cause=error) from error
        async with self.lock:
            process_id = allocate_pty_process_id(self.reserved)
            self.reserved.add(process_id)
            pruned = self._prune()
            self.running[process_id] = entry
        if pruned is not None:
            await self._terminate(pruned)
        return await self._update(process_id, entry, clamp_pty_yield_time_ms(yield_ms), max_tokens)

    async def write(self, process_id: int, chars: str, *, yield_ms: int, max_tokens: int | None) -> PtyExecUpdate:
        async with self.lock:
            entry = self.running.get(process_id)
        if entry is None:
            raise PtySessionNotFoundError(session_id=process_id)
        if chars:
            if entry.terminal is None:
                raise RuntimeError("stdin is not available for this process (start it with tty=true)")
            await entry.terminal.send(chars)
            await asyncio.sleep(0.1)
        entry.last_used = time.monotonic()
        waits = resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=chars == "")
        return await self._update(process_id, entry, waits, max_tokens)

    async def terminate_all(self) -> None:
        async with self.lock:
            entries = list(self.running.values())
            self.running.clear()
            self.reserved.clear()
        for entry in entries:
            await self._terminate(entry)

    async def _terminal(self, argv: list[str], cwd: str, env: dict[str, str]) -> Interactive:
        # A terminal runs its command as the sandbox's user; the directory and environment
        # are set by env(1) in front of it.
        command = ["env", f"--chdir={cwd}", *(f"{key}={value}" for key, value in env.items()), *argv]
        terminal = await self.sandbox.pty.create(cmd=command)
        entry = Interactive(terminal=terminal)
        entry.reader = asyncio.create_task(self._read_terminal(entry, terminal))
        return entry

    async def _read_terminal(self, entry: Interactive, terminal: AsyncTerminal) -> None:
        exit_code = None
        try:
            async for data in terminal.attach():
                await entry.add(data)
            exit_code = (await terminal.refresh()).exit_code
        except Exception:
            pass
        finally:
            entry.end(exit_code)

    async def _command(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float | None) -> Interactive:
        entry = Interactive(exec_id=f"agents-{uuid.uuid4().hex}")
        events = self.sandbox.commands.stream(argv, cwd=cwd, env=env or None, timeout=timeout,
                                              exec_id=entry.exec_id)
        first = await anext(events)  # the command started (or the call failed here)
        entry.reader = asyncio.create_task(self._read_command(entry, first, events))
        return entry

    async def _read_command(self, entry: Interactive, first: Any, events: Any) -> None:
        exit_code = None
        try:
            event = first
            while True:
                if event.kind in ("stdout", "stderr"):
                    await entry.add(event.text.encode())
                elif event.kind == "exit":
                    exit_code = event.exit_code if not event.timed_out else 124
                event = await anext(events)
        except StopAsyncIteration:
            pass
        except Exception:
            pass
        finally:
            entry.end(exit_code)
            try:
                await events.aclose()
            except Exception:
                pass

    async def _update(self, process_id: int, entry: Interactive, yield_ms: int, max_tokens: int | None) -> PtyExecUpdate:
        output, original, done = await collect_pty_output(
            output_chunks=entry.chunks, output_lock=entry.lock, output_notify=entry.notify,
            is_done=entry.closed.is_set, yield_time_ms=yield_ms, max_output_tokens=max_tokens,
        )
        live: int | None = process_id
        if done:
            async with self.lock:
                removed = self.running.pop(process_id, None)
                self.reserved.discard(process_id)
            if removed is not None:
                await self._terminate(removed)
            live = None
        return PtyExecUpdate(process_id=live, output=output, exit_code=entry.exit_code if done else None,
                             original_token_count=original)

    def _prune(self) -> Interactive | None:
        if len(self.running) < PTY_PROCESSES_MAX:
            return None
        meta = [(pid, entry.last_used, entry.closed.is_set()) for pid, entry in self.running.items()]
        pid = process_id_to_prune_from_meta(meta)
        if pid is None:
            return None
        self.reserved.discard(pid)
        return self.running.pop(pid, None)

    async def _terminate(self, entry: Interactive) -> None:
        """Ends the process (a terminal closed, a command cancelled) and its reader."""
        try:
            if not entry.closed.is_set():
                if entry.terminal is not None:
                    await entry.terminal.close()
                elif entry.exec_id is not None:
                    await self.sandbox.commands.cancel(entry.exec_id)
        except Exception:
            pass
        reader, entry.reader = entry.reader, None
        if reader is not None and reader is not asyncio.current_task():
            if not reader.done():
                reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
