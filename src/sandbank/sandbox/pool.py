"""The warm pool: sandboxes started ahead of demand (data stack imported), so a lease takes ms.

Its size follows demand: leases that come in a burst (BURST_WINDOW) grow it, up to a ceiling,
so the next burst like it is served from the pool instead of waiting for cold starts one after
another; after KEEP_GROWN without such a burst it shrinks back to its floor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

from ..errors import AtCapacity
from .backends.base import Backend, Sandbox

log = logging.getLogger(__name__)
RETRY_AFTER_FAILURE = 5.0
REFILL_DELAY = 0.25
BURST_WINDOW = 10.0  # leases this close together are one burst
KEEP_GROWN = 600.0  # a grown pool keeps its size this long after its last burst


class WarmPool:
    """Sandboxes started ahead of demand, each handed out once."""

    def __init__(
        self,
        backend: Backend,
        size: int,
        preimport: bool,
        *,
        ceiling: int = 0,
        room: Callable[[], int] | None = None,
    ) -> None:
        self.backend = backend
        self.floor = size
        self.size = size  # what it fills to now: between floor and ceiling
        self.ceiling = max(size, ceiling)
        # How many more sandboxes the machine has room for beside the sessions (None: the
        # floor's worth only); a grown pool never takes a session's room.
        self.room = room
        self.preimport = preimport
        self._leases: deque[float] = deque()  # when the leases of the last BURST_WINDOW came
        self._grown_at = 0.0
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
        self._leased()
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

    def wake(self) -> None:
        """Room was made on the machine: fill up to what is wanted now."""
        if self.size > self.floor:
            self._wake.set()

    def _leased(self) -> None:
        now = time.monotonic()
        self._leases.append(now)
        while now - self._leases[0] > BURST_WINDOW:
            self._leases.popleft()
        burst = len(self._leases)
        if burst > self.floor and self.ceiling > self.floor:
            self._grown_at = now  # a burst beyond the floor keeps the pool grown
            if burst > self.size:
                self.size = min(burst, self.ceiling)
                log.info("the warm pool grows to %d sandboxes (%d leases in a burst)",
                         self.size, burst)  # fmt: skip

    def _wanted(self) -> int:
        """How many sandboxes to hold now: its size, within the machine's room."""
        if self.size == self.floor or self.room is None:
            return self.size
        return max(self.floor, min(self.size, len(self._ready) + self.room()))

    def _shrink_if_quiet(self) -> list[Sandbox]:
        """Back to the floor after KEEP_GROWN without a burst; the sandboxes to close."""
        if self.size == self.floor or time.monotonic() - self._grown_at < KEEP_GROWN:
            return []
        self.size = self.floor
        surplus = []
        while len(self._ready) > self.size:
            surplus.append(self._ready.pop())
        log.info("the warm pool shrinks to %d sandboxes (no burst for %.0f s)",
                 self.size, KEEP_GROWN)  # fmt: skip
        return surplus

    async def wait_full(self, timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self._ready) < self._wanted():  # noqa: ASYNC110 - tests and benchmarks
                await asyncio.sleep(0.05)

    async def _fill_forever(self) -> None:
        while not self._closed:
            for sandbox in self._shrink_if_quiet():
                await sandbox.close()
            if len(self._ready) >= self._wanted():
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # a grown pool looks at its age
                    await asyncio.wait_for(self._wake.wait(), KEEP_GROWN / 10)
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
