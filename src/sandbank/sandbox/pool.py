"""The warm pool: sandboxes started ahead of demand (data stack imported), so a lease takes ms."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from ..errors import AtCapacity
from .backends.base import Backend, Sandbox

log = logging.getLogger(__name__)
RETRY_AFTER_FAILURE = 5.0
REFILL_DELAY = 0.25


class WarmPool:
    """Sandboxes started ahead of demand, each handed out once."""

    def __init__(self, backend: Backend, size: int, preimport: bool) -> None:
        self.backend = backend
        self.size = size
        self.preimport = preimport
        self._ready: deque[Sandbox] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.started = 0  # sandboxes the pool has started, for tests and benchmarks

    def start(self) -> None:
        if self.size > 0:
            self._task = asyncio.create_task(self._fill_forever())

    @property
    def ready(self) -> int:
        return len(self._ready)

    async def take(self) -> Sandbox:
        """A started sandbox, never handed out before. An empty pool means a cold start."""
        # Refill a moment later: starting a sandbox costs a core for a while, and the client
        # that just leased one is about to make its first call.
        asyncio.get_running_loop().call_later(REFILL_DELAY, self._wake.set)
        while self._ready:
            sandbox = self._ready.popleft()
            if not sandbox.closed:
                return sandbox
        # Cold path: skip the data-stack import so the lease stays fast; the user pays for
        # `import pandas` only if they use it.
        sandbox = self.backend.new(preimport=False)
        await sandbox.start()
        return sandbox

    async def wait_full(self, timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self._ready) < self.size:  # noqa: ASYNC110 - tests and benchmarks only
                await asyncio.sleep(0.05)

    async def _fill_forever(self) -> None:
        while not self._closed:
            if len(self._ready) >= self.size:
                self._wake.clear()
                await self._wake.wait()
                continue
            sandbox = self.backend.new(preimport=self.preimport)
            try:
                await sandbox.start()
            except AtCapacity as e:  # no room on the machine (its disk): not a failure
                log.warning("the warm pool waits for room: %s", e.message)
                await asyncio.sleep(RETRY_AFTER_FAILURE)
                continue
            except Exception:
                log.exception("the warm pool could not start a sandbox; retrying")
                await asyncio.sleep(RETRY_AFTER_FAILURE)
                continue
            self.started += 1
            if self._closed:
                await sandbox.close()
                return
            self._ready.append(sandbox)

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._ready:
            await self._ready.popleft().close()
