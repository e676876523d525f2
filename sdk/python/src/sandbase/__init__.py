"""SandBase's Python SDK: sandboxes for AI agents (commands, Python code, files, terminals, egress,
snapshots), agent runs (`client.agent_runs`), and the team's keys, members, credits, usage,
audit log, secrets, runs and model store. `Sandbase`/`Sandbox` block; `AsyncSandbase`/`AsyncSandbox` are the same with `await`."""

from . import models
from ._runs_async import AsyncAgentRuns
from ._runs_sync import AgentRuns
from ._async import AsyncCode, AsyncCommands, AsyncFiles, AsyncProcess, AsyncSandbase, AsyncSandbox, AsyncTerminal
from ._core import CodeEvent, CommandEvent
from ._sync import Code, Commands, Files, Process, Sandbase, Sandbox, Terminal
from .errors import (
    AuthenticationError,
    Conflict,
    InsufficientCredits,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    RateLimited,
    SandbaseError,
    ServiceUnavailable,
    SpendCapReached,
)

__all__ = [
    "AgentRuns", "AsyncAgentRuns", "AsyncCode", "AsyncCommands", "AsyncFiles", "AsyncProcess", "AsyncSandbase", "AsyncSandbox", "AsyncTerminal",
    "AuthenticationError", "Code", "CodeEvent", "CommandEvent", "Commands", "Conflict", "Files", "InsufficientCredits",
    "InvalidRequest", "NotFound", "PermissionDenied", "Process", "RateLimited", "Sandbase",
    "SandbaseError", "Sandbox", "ServiceUnavailable", "SpendCapReached", "Terminal", "models",
]
__version__ = "0.1.0"
