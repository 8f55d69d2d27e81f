"""The runtime's vocabulary: tool calls, their results, and the sandbox interface."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

EditorCommand = Literal["view", "create", "str_replace", "insert", "undo_edit"]

# Return codes the runtime itself assigns (documented in the README):
RC_TIMEOUT = 124  # the call hit its deadline and was interrupted
RC_KILLED = 137  # the interpreter was killed (memory limit, restart after a timeout, destroy)


@dataclass(frozen=True)
class PythonCall:
    code: str


@dataclass(frozen=True)
class BashCall:
    command: str


@dataclass(frozen=True)
class EditorCall:
    command: EditorCommand
    path: str
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = None
    view_range: tuple[int, int] | None = None


ToolCall = PythonCall | BashCall | EditorCall


@dataclass
class ExecResult:
    """What one call did. A failed program is a result like any other."""

    stdout: str = ""
    stderr: str = ""
    return_code: int = 0
    files: list[str] = field(default_factory=list)  # workspace-relative paths produced
    duration_ms: int = 0


class Sandbox(Protocol):
    """One isolated environment: a persistent interpreter, shell and workspace.

    Verbs mirror a process: `start`, `execute`, `interrupt` (inside `execute`'s deadline
    handling), `close`. A sandbox is used by one session only, and never reused.
    """

    id: str
    uid: int

    @property
    def workspace(self) -> Path:
        """The workspace directory as the server sees it (host side)."""
        ...

    async def start(self) -> None: ...

    async def execute(self, call: ToolCall, deadline: float) -> ExecResult:
        """Run one call; `deadline` is a `time.monotonic()` instant, counted from arrival."""
        ...

    async def close(self) -> None:
        """Kill every process and remove every host resource the sandbox holds."""
        ...
