"""The runtime's vocabulary: tool calls and their results (backends: `managed.ManagedSandbox`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

# Why a session's interpreter was replaced by a fresh one (after the answer to the call).
RestartReason = Literal["timeout", "memory", "crash", "protocol", "cancelled"]
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
    # Display bundles, as notebooks show them: {"data": {media type: text}, "cut": [...]}.
    displays: list[dict[str, Any]] = field(default_factory=list)


# A streamed call's events as they happen: ("stdout" | "stderr", text) or ("display", bundle).
OnEvent = Callable[[str, Any], None]
