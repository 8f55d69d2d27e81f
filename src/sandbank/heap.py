"""The server's heap kept out of the cycle collector's way: what lives is frozen as it settles.

CPython's cycle collector walks every tracked object of the oldest generation on a full
collection, and allocation triggers one whenever that generation has grown by a quarter. Each
idle session costs the server ~150 tracked objects (its worker's pipe readers, futures, deques,
paths), so at 1,000 sessions a full collection walked ~350,000 objects: 100-170 ms in which no
request moved (`/health`'s slowest answer went from 0.6 ms to 123 ms, the loop's longest stall
from 4 to 79 ms).

So the heap is kept in two parts. Every `TICK` seconds the young generations are collected
(cheap: they hold only what is new) and what survived is frozen (`gc.freeze`): automatic
collections then walk only the objects made since the last tick. A frozen object that dies is
freed by its reference count like any other; only garbage in reference cycles waits, for a
full collection (thaw, collect, freeze) run when the frozen heap has doubled since the last one.
So what waits is bounded by the live heap, and the rare long pause is paid once per as much new
long-lived memory as the server already held (from start: ~285,000 objects, some 1,900
idle sessions' worth).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger("sandbank")

TICK = 1.0


class HeapKeeper:
    """Freezes what survives, and collects the frozen heap whole when it has doubled."""

    def __init__(self, tick: float = TICK) -> None:
        self.tick = tick
        self.base = 0  # frozen objects right after the last full collection
        self.added = 0  # objects frozen since (an overcount: some have died since)
        self.full_collections = 0
        self.last_full_seconds = 0.0

    @property
    def frozen(self) -> int:
        """Objects frozen, as last counted plus those frozen since (no walk of the heap)."""
        return self.base + self.added

    def settle(self) -> None:
        """A full collection, then everything frozen: at start, and when the heap doubled."""
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.base = gc.get_freeze_count()
        self.added = 0
        self.last_full_seconds = time.perf_counter() - started
        self.full_collections += 1

    def step(self) -> None:
        """One tick: young garbage collected, survivors frozen, a full collection when due."""
        gc.collect(1)  # gens 0 and 1: only what was made since the last tick
        settled = len(gc.get_objects(generation=2))  # survivors since the last freeze
        if not settled:
            return
        gc.freeze()
        self.added += settled
        if self.added < max(self.base, 1):
            return
        # The overcount reached the base: count exactly (a walk of the frozen list, no more
        # often than once per base's worth of new objects), and collect whole if doubled.
        exact = gc.get_freeze_count()
        if exact >= 2 * self.base:
            self.settle()
            log.info(
                "full collection: %d objects frozen after it, %.0f ms",
                self.base,
                self.last_full_seconds * 1000,
            )
        else:
            self.added = exact - self.base

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            self.step()
