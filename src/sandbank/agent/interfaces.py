"""What the agent needs from the rest of the server: a workbench, a recorder, the stored history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sandbank.agent.records import Role
from sandbank.protocol.calls import ExecResult, ToolCall


@dataclass(frozen=True)
class FileInfo:
    name: str  # workspace-relative
    size: int  # bytes


class Workbench(Protocol):
    """The session's sandbox as the agent uses it."""

    async def execute(self, call: ToolCall, timeout_s: float) -> ExecResult:
        """Run one call; a timed-out call returns `RC_TIMEOUT`, never raises for user code."""
        ...

    async def list_files(self) -> list[FileInfo]:
        """The workspace's files (recursively), for the system prompt."""
        ...


class Recorder(Protocol):
    """Where a run's messages and progress go, as they happen (the session store)."""

    async def add_message(self, role: Role, content: str, internal: bool) -> None: ...

    async def set_status(self, message: str) -> None:
        """A short, user-readable progress note (the session's `status_message`)."""
        ...

    def text(self, step: int, delta: str) -> None:
        """A piece of the model's text for `step` as it is generated: shown, never stored (the
        step's reply is recorded whole by `add_message`). Must not block."""
        ...


@dataclass(frozen=True)
class HistoryMessage:
    """A message of an earlier turn, as stored (the current question is not among them)."""

    role: Role
    content: str
    internal: bool
