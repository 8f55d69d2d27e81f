"""The event loop's lag: the longest stall of a window, kept as stalls come and go."""

from __future__ import annotations

import asyncio
import time

from sandbank.looplag import LoopLag


def test_the_longest_stall_of_the_window_is_kept_until_it_leaves_the_window() -> None:
    lag = LoopLag(window=10)
    lag.note(0.002, now=100)
    lag.note(0.050, now=101)
    lag.note(0.010, now=102)
    assert lag.longest(now=103) == 0.050
    assert lag.longest(now=111.5) == 0.010  # the 50 ms stall left the window
    assert lag.longest(now=200) == 0.0
    assert lag.worst == 0.050


def test_a_blocking_call_on_the_loop_shows_as_lag() -> None:
    async def main() -> float:
        lag = LoopLag(tick=0.01, window=5)
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # noqa: ASYNC251 - the point: work done on the loop without yielding
        await asyncio.sleep(0.05)
        task.cancel()
        return lag.longest()

    assert asyncio.run(main()) >= 0.15
