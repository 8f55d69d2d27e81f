"""Database engines (SQLite tuned for one writer, or PostgreSQL) and applying migrations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url

from sandbank.errors import ConfigError

MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 30.0
# Any constant will do: servers sharing a database take this lock while migrating.
MIGRATION_LOCK_ID = 0x5A4D_B4E4


@dataclass(frozen=True)
class Engines:
    """A writer and a reader engine; for PostgreSQL both are the same pooled engine."""

    writer: Engine
    reader: Engine
    is_sqlite: bool
    pool_size: int

    def dispose(self) -> None:
        self.writer.dispose()
        if self.reader is not self.writer:
            self.reader.dispose()


def create_engines(url: str) -> Engines:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ConfigError("SQLite needs a file: readers and the writer share it")
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        # SQLite allows one writer at a time: a one-connection writer engine that takes the
        # write lock when its transaction begins (so read-then-write never deadlocks), and a
        # pool of readers that WAL lets run alongside it.
        writer = _sqlite_engine(url, pool_size=1, begin="BEGIN IMMEDIATE")
        reader = _sqlite_engine(url, pool_size=4, begin="BEGIN")
        return Engines(writer, reader, is_sqlite=True, pool_size=4)
    if parsed.get_backend_name() == "postgresql":
        engine = sa.create_engine(url, pool_size=8, max_overflow=4, pool_pre_ping=True)
        return Engines(engine, engine, is_sqlite=False, pool_size=12)
    raise ConfigError(f"unsupported database URL scheme {parsed.drivername!r}")


def _sqlite_engine(url: str, *, pool_size: int, begin: str) -> Engine:
    engine = sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Autocommit at the driver level so that SQLAlchemy's "begin" below is the only
        # BEGIN issued (pysqlite's own implicit transactions would defer the lock).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable enough in WAL mode, much faster
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(begin)

    return engine


def migrate(engines: Engines) -> None:
    """Bring the schema to the newest migration; a no-op when it is already there."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engines.writer.begin() as conn:
        if not engines.is_sqlite:
            # Several servers may start together; one migrates while the others wait.
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK_ID)))
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
