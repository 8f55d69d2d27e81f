"""Users, chats, runs and file records: the `Store` of aggregates, and its chooser."""

from __future__ import annotations

from sandbank.config import Settings
from sandbank.store.interfaces import Accounts, Chats, FileRecords, RunQueue, Store
from sandbank.store.records import (
    ApiKey,
    ChatSession,
    FileRecord,
    Message,
    Origin,
    Role,
    Run,
    RunState,
    SessionStatus,
    User,
    hash_secret,
)

__all__ = [
    "Accounts",
    "ApiKey",
    "ChatSession",
    "Chats",
    "FileRecord",
    "FileRecords",
    "Message",
    "Origin",
    "Role",
    "Run",
    "RunQueue",
    "RunState",
    "SessionStatus",
    "Store",
    "User",
    "database_url",
    "hash_secret",
    "open_store",
]


def database_url(settings: Settings) -> str:
    """The configured database URL; empty means the SQLite file in the data directory."""
    url = settings.database_url.get_secret_value()
    return url or f"sqlite:///{(settings.data_dir / 'sandbank.db').resolve()}"


def open_store(settings: Settings) -> Store:
    """The store the settings name, connected and migrated (`memory://` is the fake).

    Blocking: called while the app is put together, before it serves (or from a thread)."""
    url = database_url(settings)
    if url == "memory://":
        from sandbank.store.memory import memory_store

        return memory_store()
    from sandbank.store.sql import Database, sql_store

    return sql_store(Database.open(url))
