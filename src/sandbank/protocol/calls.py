"""The vocabulary of a sandbox: tool calls, their results, and a streamed call's events."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# Why a session's interpreter was replaced by a fresh one (after the answer to the call).
RestartReason = Literal["timeout", "memory", "crash", "protocol", "cancelled"]
EditorCommand = Literal["view", "create", "str_replace", "insert", "undo_edit"]
# The text editor's commands, with the semantics of Anthropic's text-editor tool.
EDITOR_COMMANDS: tuple[EditorCommand, ...] = (
    "view",
    "create",
    "str_replace",
    "insert",
    "undo_edit",
)

# Return codes the runtime itself assigns (documented in the README):
RC_TIMEOUT = 124  # the call hit its deadline and was interrupted
RC_KILLED = 137  # the interpreter was killed (memory limit, restart after a timeout, destroy)


@dataclass(frozen=True)
class PythonCall:
    """Python code. `context`: a context of the session (None: its main namespace); `envs`:
    environment variables set for this call only; `notebook`: the last expression's value is
    the result's `main` bundle and an exception its `error`, as a notebook kernel reports them
    (instead of text on stdout and stderr)."""

    code: str
    context: str | None = None
    envs: Mapping[str, str] | None = None
    notebook: bool = False
    cwd: str | None = None  # where a context starts, on its first call (a sandbox path)


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

# A display bundle, as notebooks have it: {"data": {media type: text}, "cut": [media type]}.
Bundle = dict[str, Any]


@dataclass(frozen=True)
class CellError:
    """An exception a notebook call raised: its type's name, its message, the traceback."""

    name: str
    value: str
    traceback: str


@dataclass
class ExecResult:
    """What one call did. A failed program is a result like any other."""

    stdout: str = ""
    stderr: str = ""
    return_code: int = 0
    files: list[str] = field(default_factory=list)  # workspace-relative paths produced
    duration_ms: int = 0
    displays: list[Bundle] = field(default_factory=list)
    # A notebook call's (PythonCall.notebook): its last value, its exception, its number.
    main: Bundle | None = None
    error: CellError | None = None
    execution_count: int = 0
    # The first call after a resume: what the pause could not keep, by name, with the reason.
    not_restored: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Output:
    """Text a streamed call wrote, as it came."""

    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True)
class Display:
    """A display bundle a streamed call produced, as it appeared."""

    bundle: Bundle


@dataclass(frozen=True)
class Done:
    """The end of a streamed call: its whole result."""

    result: ExecResult


Event = Output | Display | Done
# How a sandbox hands a running call's output over, as it is produced.
OnEvent = Callable[[Output | Display], None]
