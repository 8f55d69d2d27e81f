"""How late the event loop runs what is due: the longest stall over a recent window.

A callback is scheduled every `TICK` seconds; how much later than asked it ran is the time the
loop spent on something else without yielding (a sweep holding the GIL, a parse, a collection).
The longest of the last `WINDOW` seconds is served as a gauge, so an operator sees this class of
problem (work that grows with the sessions, run on the loop) before clients do.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

TICK = 0.05
WINDOW = 10.0


class LoopLag:
    """The loop's stalls, measured by a ticking task while `run` runs."""

    def __init__(self, tick: float = TICK, window: float = WINDOW) -> None:
        self.tick = tick
        self.window = window
        self._stalls: deque[tuple[float, float]] = deque()  # (when, how late), decreasing late
        self.worst = 0.0  # the longest stall since start

    def longest(self, now: float | None = None) -> float:
        """The longest stall of the last window, in seconds."""
        now = time.monotonic() if now is None else now
        while self._stalls and self._stalls[0][0] < now - self.window:
            self._stalls.popleft()
        return self._stalls[0][1] if self._stalls else 0.0

    def note(self, late: float, now: float) -> None:
        """A tick ran `late` seconds late: kept while no later, longer stall outdoes it."""
        while self._stalls and self._stalls[-1][1] <= late:
            self._stalls.pop()  # a monotonic deque: the front is the window's maximum
        self._stalls.append((now, late))
        self.worst = max(self.worst, late)

    async def run(self) -> None:
        while True:
            due = time.monotonic() + self.tick
            await asyncio.sleep(self.tick)
            now = time.monotonic()
            self.note(max(0.0, now - due), now)
