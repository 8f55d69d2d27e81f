"""The SQL stores' database: persistence, migrations, and two replicas' engines on one database."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
import sqlalchemy as sa

from sandbank.config import Settings
from sandbank.store import Store, open_store
from sandbank.store.sql import Database
from tests.store.conftest import _drop_database, _fresh_database
from tests.store.support import LEASE, new_chat, started
from tests.tiers import param

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
async def test_reopening_keeps_data_and_reapplies_no_migration(
    store_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=store_url, data_dir=tmp_path)
    first = open_store(settings)
    sid = await new_chat(first)
    await started(first, sid, content="kept")
    await first.close()

    second = open_store(settings)
    try:
        assert [m.content for m in await second.chats.messages(sid)] == ["kept"]
    finally:
        await second.close()
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        versions = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
    engine.dispose()
    assert [v[0] for v in versions] == ["0005"]


async def test_the_default_database_is_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    store = open_store(Settings(data_dir=tmp_path / "data"))
    try:
        await store.accounts.create_user("alice")
    finally:
        await store.close()
    assert (tmp_path / "data" / "sandbank.db").exists()


# --- two replicas on one database ---------------------------------------------------------


@pytest.fixture(params=["sqlite", param("postgresql", "postgres")])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sandbank.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url, name = _fresh_database(server)
        yield url
        _drop_database(server, name)


@pytest.fixture
async def replicas(shared_url: str, tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores with engines of their own on one database, as two replicas have."""
    settings = Settings(database_url=shared_url, data_dir=tmp_path)
    one, two = open_store(settings), open_store(settings)
    try:
        yield one, two
    finally:
        await one.close()
        await two.close()


async def test_two_claimers_racing_claim_each_of_100_runs_exactly_once(
    replicas: tuple[Store, Store], shared_url: str
) -> None:
    one, two = replicas
    expected = {(await started(one, await new_chat(one))).id for _ in range(100)}
    claims: dict[str, list[str]] = {"r1": [], "r2": []}

    async def claimer(store: Store, name: str) -> None:
        for _ in range(200):  # bounded: 100 runs at 1-3 a claim
            got = await store.runs.claim(name, 3, LEASE)
            claims[name] += [r.id for r in got]
            if not got and len(claims["r1"]) + len(claims["r2"]) >= 100:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(claimer, one, "r1")
        tg.start_soon(claimer, two, "r2")
    everything = claims["r1"] + claims["r2"]
    assert sorted(everything) == sorted(expected)  # each once, none twice
    if shared_url.startswith("postgresql"):
        # Both took part (SQLite's one writer may let one claimer take everything).
        assert claims["r1"] and claims["r2"]


async def test_run_limits_hold_across_replicas(replicas: tuple[Store, Store]) -> None:
    one, two = replicas
    chats = [await new_chat(one, f"user{i}") for i in range(12)]
    outcomes: list[str] = []

    async def post(store: Store, sid: str) -> None:
        outcome = await store.runs.start(
            sid, "q", max_per_user=5, max_total=3, owner=None, lease_seconds=LEASE
        )
        outcomes.append(outcome if isinstance(outcome, str) else "started")

    async with anyio.create_task_group() as tg:
        for index, sid in enumerate(chats):
            tg.start_soon(post, (one, two)[index % 2], sid)
    assert outcomes.count("started") == 3
    assert outcomes.count("total_limit") == 9
    statuses = [chat.status for sid in chats if (chat := await one.chats.get(sid))]
    assert statuses.count("PENDING") == 3


def test_replicas_starting_together_migrate_once(postgres_server: str) -> None:
    url, name = _fresh_database(postgres_server)
    opened: list[Database] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(3)

    def start() -> None:
        try:
            gate.wait(timeout=10)
            opened.append(Database.open(url))
        except BaseException as exc:  # noqa: BLE001 - collected, then asserted on
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert errors == [] and len(opened) == 3
        conninfo = url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(conninfo) as conn:
            versions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
            assert versions == [("0005",)]
    finally:
        for db in opened:
            db.engines.dispose()
        _drop_database(postgres_server, name)
