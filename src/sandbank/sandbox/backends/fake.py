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
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ...config import Settings
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
from .base import RUNTIME, Backend, new_sandbox_id

Handler = Callable[[ToolCall], ExecResult | Awaitable[ExecResult]]


def succeed(call: ToolCall) -> ExecResult:
    return ExecResult()


class FakeSandbox:
    """A sandbox whose calls go to a handler, one at a time."""

    def __init__(self, sandbox_id: str, base_dir: Path, handler: Handler) -> None:
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
        await asyncio.to_thread(shutil.rmtree, self.dir, True)


def _loop_time(deadline: float) -> float:
    """A `time.monotonic()` deadline on the event loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline - time.monotonic())


class FakeBackend(Backend):
    """Makes `FakeSandbox`es; `sandboxes` lists every one made, for assertions."""

    name = "fake"
    claims = frozenset({RUNTIME})

    def __init__(self, settings: Settings, handler: Handler = succeed) -> None:
        super().__init__(settings)
        self.handler = handler
        self.sandboxes: list[FakeSandbox] = []

    def new(self, preimport: bool) -> FakeSandbox:
        sandbox = FakeSandbox(new_sandbox_id(), self.base_dir, self.handler)
        self.sandboxes.append(sandbox)
        return sandbox
