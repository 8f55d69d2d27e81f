"""The store in memory, for tests and throwaway servers: same behaviour, nothing persisted."""

from __future__ import annotations

from sandbank.store.interfaces import Store
from sandbank.store.memory.accounts import MemoryAccounts
from sandbank.store.memory.chats import MemoryChats
from sandbank.store.memory.file_records import MemoryFileRecords
from sandbank.store.memory.runs import MemoryRunQueue
from sandbank.store.memory.state import MemoryState

__all__ = ["MemoryState", "memory_store"]


def memory_store() -> Store:
    """Every aggregate over one `MemoryState`: the fake."""
    state = MemoryState()
    return Store(
        accounts=MemoryAccounts(state),
        chats=MemoryChats(state),
        runs=MemoryRunQueue(state),
        file_records=MemoryFileRecords(state),
        closer=_nothing,
    )


async def _nothing() -> None:
    pass
