"""The heap keeper (heap.py): survivors frozen, young cycles collected, frozen cycles collected
once the heap has doubled. Each case runs in a Python of its own: the test process's own
collector is left alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PRELUDE = """
import gc, weakref
from sandbank.heap import HeapKeeper

class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it

keeper = HeapKeeper()
keeper.settle()
"""


def check(body: str) -> None:
    code = PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_what_survives_a_tick_is_frozen_and_counted() -> None:
    check("""
        before = keeper.frozen
        kept = [Node() for _ in range(5000)]
        keeper.step()
        assert not gc.get_objects(generation=2), "everything that lived was frozen"
        assert keeper.frozen >= before + 5000
        assert gc.get_freeze_count() >= before + 5000
        assert keeper.full_collections == 1  # only the first settle: far from doubled
    """)


def test_a_young_cycle_is_collected_at_the_tick_not_frozen() -> None:
    check("""
        node = Node()
        gone = weakref.ref(node)
        del node
        keeper.step()
        assert gone() is None
    """)


def test_a_frozen_cycle_waits_for_the_heap_to_double_then_is_collected() -> None:
    check("""
        node = Node()
        gone = weakref.ref(node)
        keeper.step()  # frozen while alive
        del node
        keeper.step()
        gc.collect()  # an automatic full collection does not walk the frozen heap
        assert gone() is not None
        grown = [Node() for _ in range(keeper.base // 2)]
        keeper.step()  # half the base more: counted exactly, no full collection yet
        assert keeper.full_collections == 1 and gone() is not None
        assert keeper.added >= len(grown)
        more = [Node() for _ in range(keeper.base)]
        keeper.step()  # doubled: thawed, collected, frozen again
        assert keeper.full_collections == 2
        assert gone() is None
        assert keeper.base >= len(grown) + len(more)
        assert keeper.added == 0
    """)
