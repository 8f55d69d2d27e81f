"""Fixtures: one `store` per test, parametrized over every implementation (memory, SQLite,
PostgreSQL): the store's contract suite is every test that takes it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from sandbank.config import Settings
from sandbank.store import Store, open_store
from tests.postgres import running_postgres
from tests.tiers import needs, param


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
@needs("postgres")
def postgres_server() -> Iterator[str]:
    with running_postgres() as url:
        yield url


def _fresh_database(server_url: str) -> tuple[str, str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    conninfo = server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + f"/{name}", name


def _drop_database(server_url: str, name: str) -> None:
    conninfo = server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(params=["memory", "sqlite", param("postgresql", "postgres")])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL of each kind, empty of data."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sandbank.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url, name = _fresh_database(server)
        yield url
        _drop_database(server, name)


@pytest.fixture
async def store(store_url: str, tmp_path: Path) -> AsyncIterator[Store]:
    opened = open_store(Settings(database_url=store_url, data_dir=tmp_path))
    try:
        yield opened
    finally:
        await opened.close()
