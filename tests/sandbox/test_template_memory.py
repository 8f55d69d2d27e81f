"""The fork templates' memory is read at most every few seconds, off the caller's thread."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from sandbank.sandbox.backends.fork_template import MemoryReadings, process_memory


class CountingReader:
    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.value = 1

    def __call__(self, pid: int) -> dict[str, int]:
        self.calls.append((pid, threading.current_thread().name))
        return {"pss": self.value * pid, "rss": self.value}


def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_new_process_is_read_at_once_and_then_served_from_the_last_reading() -> None:
    reader = CountingReader()
    readings = MemoryReadings(every=3600, read=reader)
    assert readings.of([7]) == {7: {"pss": 7, "rss": 1}}
    wait_for(lambda: not readings._refreshing)
    before = len(reader.calls)
    reader.value = 2
    for _ in range(50):
        assert readings.of([7]) == {7: {"pss": 7, "rss": 1}}  # not read again within `every`
    assert len(reader.calls) == before


def test_a_stale_reading_is_refreshed_in_another_thread() -> None:
    reader = CountingReader()
    readings = MemoryReadings(every=0.05, read=reader)
    readings.of([3])
    reader.value = 5
    time.sleep(0.06)
    readings.of([3])  # starts the refresh; may still answer the old value
    wait_for(lambda: readings.of([3])[3]["rss"] == 5)
    assert any(name != threading.main_thread().name for _, name in reader.calls)


def test_a_process_gone_from_the_list_is_forgotten() -> None:
    readings = MemoryReadings(every=3600, read=CountingReader())
    readings.of([1, 2])
    assert set(readings.of([2])) == {2}


def test_process_memory_reads_this_process() -> None:
    mem = process_memory(os.getpid())
    assert mem["rss"] > 1 << 20 and 0 < mem["pss"] <= mem["rss"] * 2
    assert process_memory(2**22 + 12345) == {}
