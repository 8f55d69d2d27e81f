"""Sessions, messages, users, API keys and file records: the `Store` interface and its chooser."""

from __future__ import annotations

import anyio.to_thread

from sandbank.config import Settings
from sandbank.store.base import (
    ApiKey,
    ChatSession,
    FileRecord,
    Message,
    Origin,
    Role,
    SessionStatus,
    Store,
    User,
)

__all__ = [
    "ApiKey",
    "ChatSession",
    "FileRecord",
    "Message",
    "Origin",
    "Role",
    "SessionStatus",
    "Store",
    "User",
    "database_url",
    "open_store",
]


def database_url(settings: Settings) -> str:
    """The configured database URL; empty means the SQLite file in the data directory."""
    url = settings.database_url.get_secret_value()
    return url or f"sqlite:///{(settings.data_dir / 'sandbank.db').resolve()}"


async def open_store(settings: Settings) -> Store:
    """The store the settings name, connected and migrated (`memory://` is the fake)."""
    url = database_url(settings)
    if url == "memory://":
        from sandbank.store.memory import MemoryStore

        return MemoryStore()
    from sandbank.store.sql import SqlStore

    return await anyio.to_thread.run_sync(SqlStore.open, url)
