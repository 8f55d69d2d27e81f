"""The unit of work of the SQL store: each call is one transaction on a worker thread.

Every aggregate's method is one `write` or `read` of a function of the connection; a method
that spans aggregates (a question, its chat's status and its run) composes their row helpers
in that one function, so it commits whole or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from sandbank.errors import SandbankError, StorageFull
from sandbank.store.engine import Engines, create_engines, migrate

T = TypeVar("T")
Conn = sa.Connection


class Database:
    """SQLite (one writer, pooled readers) or PostgreSQL (row locks); the event loop never
    blocks on it."""

    def __init__(self, engines: Engines) -> None:
        self.engines = engines
        # SQLite has one writer: queue writers here rather than in SQLite's busy loop.
        self._write_limiter = anyio.CapacityLimiter(1 if engines.is_sqlite else engines.pool_size)
        self._read_limiter = anyio.CapacityLimiter(engines.pool_size)

    @property
    def is_sqlite(self) -> bool:
        return self.engines.is_sqlite

    @classmethod
    def open(cls, url: str) -> Database:
        """Connect and migrate (blocking: call it from a thread at start-up)."""
        engines = create_engines(url)
        try:
            migrate(engines)
        except sa_exc.SQLAlchemyError as exc:
            engines.dispose()
            raise SandbankError(f"cannot open the database: {exc.__class__.__name__}") from exc
        return cls(engines)

    async def close(self) -> None:
        await anyio.to_thread.run_sync(self.engines.dispose)

    async def write(
        self, fn: Callable[[Conn], T], refused: Callable[[], SandbankError] | None = None
    ) -> T:
        """Run `fn` in a write transaction; when a constraint refuses it, raise `refused()`."""
        run = partial(_transact, self.engines.writer, fn, refused)
        return await anyio.to_thread.run_sync(run, limiter=self._write_limiter)

    async def read(self, fn: Callable[[Conn], T]) -> T:
        run = partial(_transact, self.engines.reader, fn, None)
        return await anyio.to_thread.run_sync(run, limiter=self._read_limiter)


def _transact(
    engine: sa.Engine, fn: Callable[[Conn], T], refused: Callable[[], SandbankError] | None
) -> T:
    try:
        with engine.begin() as conn:
            return fn(conn)
    except sa_exc.IntegrityError as exc:
        if refused is not None:
            raise refused() from None
        raise SandbankError("constraint violated") from exc
    except sa_exc.SQLAlchemyError as exc:
        if _disk_full(exc):
            raise StorageFull("the database's disk is full: nothing was stored") from exc
        # Translated at the edge; the cause stays chained for the log, never sent to clients.
        raise SandbankError(f"database error: {exc.__class__.__name__}") from exc


def _disk_full(exc: sa_exc.SQLAlchemyError) -> bool:
    """SQLite's SQLITE_FULL, PostgreSQL's disk_full (53100)."""
    orig = getattr(exc, "orig", None)
    if getattr(orig, "sqlstate", None) == "53100":
        return True
    return "database or disk is full" in str(orig)


def one(query: sa.Select[Any]) -> Callable[[Conn], sa.Row[Any] | None]:
    return lambda conn: conn.execute(query).first()


def every(query: sa.Select[Any]) -> Callable[[Conn], list[sa.Row[Any]]]:
    return lambda conn: list(conn.execute(query).all())


def scalar_int(query: sa.Select[Any]) -> Callable[[Conn], int]:
    return lambda conn: int(conn.execute(query).scalar() or 0)
