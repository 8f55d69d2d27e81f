"""`FakeBackend`: sandboxes that run nothing, answering from a handler, for tests without root.

Like httpx's MockTransport: a test gives a handler from a call to a result (or an awaitable
of one); the default answers every call with an empty success. Calls are recorded, deadlines
are honoured (a slow handler gets `RC_TIMEOUT`), and the workspace is a real directory so the
server's file operations work on it. It isolates nothing and runs no code: never a backend
for serving.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from ...config import Settings
from ...errors import Conflict, NotFound
from ...protocol.calls import (
    RC_KILLED,
    RC_TIMEOUT,
    Display,
    ExecResult,
    OnEvent,
    Output,
    RestartReason,
    ToolCall,
)
from ...protocol.filesystem import FsChange
from ...protocol.processes import (
    Exited,
    ProcessEvent,
    ProcessInfo,
    ProcessOutput,
    ProcessSpec,
    Signal,
    Started,
)
from .base import RUNTIME, Backend, new_sandbox_id

Handler = Callable[[ToolCall], ExecResult | Awaitable[ExecResult]]
# A fake process: its output and exit code from what started it (awaiting keeps it running).
ProcessHandler = Callable[[ProcessSpec], ExecResult | Awaitable[ExecResult]]


def succeed(call: ToolCall) -> ExecResult:
    return ExecResult()


def echo(spec: ProcessSpec) -> ExecResult:
    """A process that prints its arguments and exits 0."""
    return ExecResult(stdout=" ".join(spec.args) + "\n")


class FakeSandbox:
    """A sandbox whose calls go to a handler, one at a time."""

    def __init__(
        self,
        sandbox_id: str,
        base_dir: Path,
        handler: Handler,
        process_handler: ProcessHandler = echo,
    ) -> None:
        self.id = sandbox_id
        self.uid = 0
        self.root_policy: tuple[int, int, int] | None = None
        self.on_restart: Callable[[RestartReason], None] | None = None  # it never restarts
        self.dir = base_dir / sandbox_id
        self.handler = handler
        self.calls: list[ToolCall] = []
        self._lock = asyncio.Lock()
        self._closed = False
        self._running: asyncio.Task[ExecResult] | None = None
        self.process_handler = process_handler
        self.processes: dict[int, tuple[ProcessSpec, asyncio.Task[ExecResult]]] = {}
        self.dropped_contexts: list[str] = []
        self._pids = itertools.count(100)

    @property
    def workspace(self) -> Path:
        return self.dir / "ws"

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self) -> None:
        self.workspace.mkdir(parents=True)

    async def execute(
        self, call: ToolCall, deadline: float, on_event: OnEvent | None = None
    ) -> ExecResult:
        started = time.monotonic()
        async with self._lock:
            if self._closed:
                return ExecResult(stderr="the session was destroyed\n", return_code=RC_KILLED)
            self.calls.append(call)
            self._running = asyncio.ensure_future(self._answer(call))
            try:
                async with asyncio.timeout_at(_loop_time(deadline)):
                    result = await asyncio.shield(self._running)
            except TimeoutError:
                self._running.cancel()
                result = ExecResult(stderr="[fake] timed out\n", return_code=RC_TIMEOUT)
            except asyncio.CancelledError:
                if not self._closed:
                    raise
                result = ExecResult(stderr="the session was destroyed\n", return_code=RC_KILLED)
        result.duration_ms = int((time.monotonic() - started) * 1000)
        if on_event is not None:  # a streamed call: its output, then its displays, as events
            for stream in ("stdout", "stderr"):
                if text := getattr(result, stream):
                    on_event(Output(stream, text))
            for bundle in result.displays:
                on_event(Display(bundle))
        return result

    async def _answer(self, call: ToolCall) -> ExecResult:
        answer = self.handler(call)
        return await answer if inspect.isawaitable(answer) else answer

    async def close(self) -> None:
        self._closed = True
        if self._running is not None:
            self._running.cancel()
        for _, task in self.processes.values():
            task.cancel()
        await asyncio.to_thread(shutil.rmtree, self.dir, True)

    # --- processes: the handler's answer as its output, no process at all -------------------
    async def start_process(self, spec: ProcessSpec) -> AsyncIterator[ProcessEvent]:
        pid = next(self._pids)

        async def run() -> ExecResult:
            answer = self.process_handler(spec)
            return await answer if inspect.isawaitable(answer) else answer

        task = asyncio.ensure_future(run())
        self.processes[pid] = (spec, task)
        return self._follow(pid, task)

    async def connect_process(self, pid: int) -> AsyncIterator[ProcessEvent]:
        return self._follow(pid, self._process(pid)[1])

    async def _follow(
        self, pid: int, task: asyncio.Task[ExecResult]
    ) -> AsyncIterator[ProcessEvent]:
        yield Started(pid)
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
            yield Exited(-1, False, "signal: killed")
            return
        finally:
            if task.done():
                self.processes.pop(pid, None)
        for stream in ("stdout", "stderr"):
            if text := getattr(result, stream):
                yield ProcessOutput(stream, text.encode())
        code = result.return_code
        yield Exited(code, True, f"exit status {code}")

    def _process(self, pid: int) -> tuple[ProcessSpec, asyncio.Task[ExecResult]]:
        found = self.processes.get(pid)
        if found is None or found[1].done():
            raise NotFound(f"process with pid {pid} not found")
        return found

    async def list_processes(self) -> list[ProcessInfo]:
        return [ProcessInfo(pid, spec) for pid, (spec, t) in self.processes.items() if not t.done()]

    async def send_stdin(self, pid: int, data: bytes) -> None:
        self._process(pid)
        raise Conflict("a fake process reads no stdin")

    async def close_stdin(self, pid: int) -> None:
        self._process(pid)

    async def signal_process(self, pid: int, sig: Signal) -> None:
        self._process(pid)[1].cancel()

    async def watch(self, path: str, recursive: bool) -> AsyncIterator[FsChange]:
        return _never()

    async def drop_context(self, context: str) -> None:
        self.dropped_contexts.append(context)


async def _never() -> AsyncIterator[FsChange]:
    await asyncio.Event().wait()
    yield FsChange("", "create")  # pragma: no cover - never reached


def _loop_time(deadline: float) -> float:
    """A `time.monotonic()` deadline on the event loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline - time.monotonic())


class FakeBackend(Backend):
    """Makes `FakeSandbox`es; `sandboxes` lists every one made, for assertions."""

    name = "fake"
    claims = frozenset({RUNTIME})

    def __init__(
        self,
        settings: Settings,
        handler: Handler = succeed,
        process_handler: ProcessHandler = echo,
    ) -> None:
        super().__init__(settings)
        self.handler = handler
        self.process_handler = process_handler
        self.sandboxes: list[FakeSandbox] = []

    def new(self, preimport: bool) -> FakeSandbox:
        sandbox = FakeSandbox(new_sandbox_id(), self.base_dir, self.handler, self.process_handler)
        self.sandboxes.append(sandbox)
        return sandbox
