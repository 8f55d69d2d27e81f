"""The store on SQLAlchemy: SQLite (one writer, pooled readers) or PostgreSQL (row locks)."""

from __future__ import annotations

from sandbank.store.interfaces import Store
from sandbank.store.sql.accounts import SqlAccounts
from sandbank.store.sql.chats import SqlChats
from sandbank.store.sql.database import Database
from sandbank.store.sql.file_records import SqlFileRecords
from sandbank.store.sql.runs import SqlRunQueue

__all__ = ["Database", "sql_store"]


def sql_store(db: Database) -> Store:
    """Every aggregate over one database (its unit of work)."""
    return Store(
        accounts=SqlAccounts(db),
        chats=SqlChats(db),
        runs=SqlRunQueue(db),
        file_records=SqlFileRecords(db),
        closer=db.close,
    )
