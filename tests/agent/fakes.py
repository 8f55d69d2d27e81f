"""Test doubles for the loop's collaborators: an in-process FakeWorkbench and a RecordingSink."""

from __future__ import annotations

import json
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from sandbank.agent.interfaces import FileInfo
from sandbank.agent.records import Role
from sandbank.protocol.calls import (
    RC_TIMEOUT,
    BashCall,
    EditorCall,
    ExecResult,
    PythonCall,
    ToolCall,
)


class FakeWorkbench:
    """Runs Python with `exec` in one dict namespace (persistent, like the real interpreter).

    NOT a sandbox: it runs code in the test process. Files live in `root`; files new or
    changed by a call are reported as produced. A call past its timeout is abandoned and
    answered with RC_TIMEOUT, like the real runtime.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.namespace: dict[str, Any] = {"__name__": "__sandbank__"}
        self.calls: list[ToolCall] = []

    def _snapshot(self) -> dict[str, tuple[int, int]]:
        return {
            str(p.relative_to(self.root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.root.rglob("*")
            if p.is_file()
        }

    def _python(self, code: str) -> tuple[str, str, int]:
        out, err = StringIO(), StringIO()

        def print_(*args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("file", out)
            print(*args, **kwargs)

        self.namespace["print"] = print_
        self.namespace["WORKSPACE"] = str(self.root)
        try:
            exec(compile(code, "<cell>", "exec"), self.namespace)  # noqa: S102  # the fake is in-process by design
        except BaseException:  # noqa: BLE001 - the fake reports the program's failure
            err.write(traceback.format_exc())
            return out.getvalue(), err.getvalue(), 1
        return out.getvalue(), err.getvalue(), 0

    def _bash(self, command: str) -> tuple[str, str, int]:
        done = subprocess.run(
            ["bash", "-c", command], cwd=self.root, capture_output=True, text=True, check=False
        )
        return done.stdout, done.stderr, done.returncode

    def _editor(self, call: EditorCall) -> tuple[str, str, int]:
        path = self.root / call.path.removeprefix("/workspace/")
        if call.command == "create":
            path.write_text(call.file_text or "")
            return f"File created: {call.path}", "", 0
        if call.command == "view":
            lines = path.read_text().splitlines()
            return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines, 1)), "", 0
        return "", f"FakeWorkbench does not do {call.command}", 1

    def _run(self, call: ToolCall) -> tuple[str, str, int]:
        if isinstance(call, PythonCall):
            return self._python(call.code)
        if isinstance(call, BashCall):
            return self._bash(call.command)
        return self._editor(call)

    async def execute(self, call: ToolCall, timeout_s: float) -> ExecResult:
        self.calls.append(call)
        before = self._snapshot()
        started = time.monotonic()
        outcome: tuple[str, str, int] | None = None
        with anyio.move_on_after(timeout_s):
            outcome = await anyio.to_thread.run_sync(self._run, call, abandon_on_cancel=True)
        duration = round((time.monotonic() - started) * 1000)
        if outcome is None:
            return ExecResult(stderr="timed out", return_code=RC_TIMEOUT, duration_ms=duration)
        after = self._snapshot()
        files = sorted(name for name, stamp in after.items() if before.get(name) != stamp)
        stdout, stderr, code = outcome
        return ExecResult(stdout, stderr, code, files, duration)

    async def list_files(self) -> list[FileInfo]:
        return [FileInfo(name, size) for name, (size, _) in sorted(self._snapshot().items())]


class HangingWorkbench(FakeWorkbench):
    """A broken workbench that ignores its timeout on every tool call after the file preview."""

    async def execute(self, call: ToolCall, timeout_s: float) -> ExecResult:
        if isinstance(call, PythonCall) and "_sandbank_inspect" in call.code:
            return await super().execute(call, timeout_s)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


@dataclass
class Recorded:
    role: Role
    content: str
    internal: bool

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass
class RecordingSink:
    """A Recorder that keeps everything in lists."""

    messages: list[Recorded] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    texts: list[tuple[int, str]] = field(default_factory=list)  # (step, delta)

    async def add_message(self, role: Role, content: str, internal: bool) -> None:
        self.messages.append(Recorded(role, content, internal))

    async def set_status(self, message: str) -> None:
        self.statuses.append(message)

    def text(self, step: int, delta: str) -> None:
        self.texts.append((step, delta))

    def roles(self) -> list[tuple[str, bool]]:
        return [(m.role, m.internal) for m in self.messages]

    def of(self, role: Role) -> list[Recorded]:
        return [m for m in self.messages if m.role == role]
