"""The `Store` contract: every implementation (memory, SQLite, PostgreSQL) passes the same tests."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa

from sandbank.config import Settings
from sandbank.errors import Conflict, NotFound, SessionNotFound
from sandbank.store import Store, open_store
from sandbank.store import base as store_base

pytestmark = pytest.mark.anyio


async def _session_of(store: Store, name: str = "alice", ttl: float = 3600) -> str:
    user = await store.get_user(name) or await store.create_user(name)
    return (await store.create_session(user.id, ttl)).id


# --- users and keys ----------------------------------------------------------------------


async def test_user_names_are_unique(store: Store) -> None:
    user = await store.create_user("alice")
    with pytest.raises(Conflict):
        await store.create_user("alice")
    assert await store.get_user("alice") == user
    assert await store.get_user_by_id(user.id) == user
    assert await store.get_user("bob") is None
    assert await store.get_user_by_id("nope") is None


async def test_a_key_authenticates_its_user_until_revoked(store: Store) -> None:
    alice = await store.create_user("alice")
    await store.create_user("bob")
    key, secret = await store.create_key("alice")
    _, bob_secret = await store.create_key("bob")
    assert secret.startswith("sb_") and len(secret) > 40
    assert key.user_id == alice.id and not key.revoked
    assert await store.authenticate(secret) == alice
    assert await store.authenticate(secret + "x") is None
    assert await store.authenticate("") is None
    assert [k.id for k in await store.list_keys("alice")] == [key.id]
    assert len(await store.list_keys()) == 2

    await store.revoke_key(key.id)
    assert await store.authenticate(secret) is None
    assert (await store.list_keys("alice"))[0].revoked
    assert (await store.authenticate(bob_secret)) is not None
    await store.revoke_key(key.id)  # revoking twice is harmless
    with pytest.raises(NotFound):
        await store.revoke_key("missing")
    with pytest.raises(NotFound):
        await store.create_key("carol")


async def test_a_key_remembers_its_latest_use(store: Store) -> None:
    await store.create_user("alice")
    key, secret = await store.create_key("alice")
    other, _ = await store.create_key("alice")
    assert (await store.list_keys("alice"))[0].last_used_at is None

    await store.key_used(secret, 2000.0)
    await store.key_used(secret, 1000.0)  # a replica's late write does not go back in time
    await store.key_used(secret + "x", 3000.0)  # no such key: nothing happens
    used = {k.id: k.last_used_at for k in await store.list_keys("alice")}
    assert used == {key.id: 2000.0, other.id: None}
    await store.key_used(secret, 2500.0)
    assert {k.id: k.last_used_at for k in await store.list_keys("alice")}[key.id] == 2500.0


async def test_delete_user_removes_everything_they_own(store: Store) -> None:
    s1 = await _session_of(store, "alice")
    s2 = await _session_of(store, "alice")
    other = await _session_of(store, "bob")
    _, secret = await store.create_key("alice")
    await store.add_message(s1, "user", "hi")
    await store.upsert_file(s2, "a.csv", 10, "user")

    removed = await store.delete_user("alice")

    assert sorted(removed) == sorted([s1, s2])
    assert await store.get_user("alice") is None
    assert await store.authenticate(secret) is None
    assert await store.list_keys("alice") == []
    assert await store.get_session(s1) is None and await store.get_session(s2) is None
    assert await store.list_messages(s1) == []
    assert await store.list_files(s2) == []
    assert await store.get_session(other) is not None
    with pytest.raises(NotFound):
        await store.delete_user("alice")


# --- sessions ----------------------------------------------------------------------------


async def test_sessions_start_done_and_list_newest_first(store: Store) -> None:
    user = await store.create_user("alice")
    before = time.time()
    first = await store.create_session(user.id, 60)
    second = await store.create_session(user.id, 60)
    assert first.status == "DONE" and first.status_message is None
    assert before + 60 <= first.ttl <= time.time() + 60
    assert await store.get_session(first.id) == first
    assert await store.get_session("00000000-0000-0000-0000-000000000000") is None
    assert [s.id for s in await store.list_sessions(user.id)] == [second.id, first.id]
    assert await store.count_sessions(user.id) == 2
    with pytest.raises(NotFound):
        await store.create_session("no-such-user", 60)


async def test_only_one_of_concurrent_run_starts_wins(store: Store) -> None:
    sid = await _session_of(store)
    wins: list[bool] = []

    async def start() -> None:
        wins.append(await store.try_start_run(sid, "running"))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(start)

    assert wins.count(True) == 1 and len(wins) == 20
    session = await store.get_session(sid)
    assert session is not None and session.status == "PENDING"
    assert session.status_message == "running"
    await store.set_status(sid, "ERROR", "boom")
    assert await store.try_start_run(sid, None)  # ERROR may start again, like DONE
    with pytest.raises(SessionNotFound):
        await store.try_start_run("missing", None)
    with pytest.raises(SessionNotFound):
        await store.set_status("missing", "DONE")


async def test_fail_orphan_pending_marks_only_pending_sessions_without_a_run(
    store: Store,
) -> None:
    orphan = await _session_of(store)
    done = await _session_of(store)
    with_run = await _session_of(store)
    assert await store.try_start_run(orphan, "running")  # as a server before runs were jobs
    started = await store.start_run(
        with_run, "q", max_per_user=9, max_total=9, owner=None, lease_seconds=10
    )
    assert not isinstance(started, str)
    assert await store.count_pending() == 2

    assert await store.fail_orphan_pending("server restarted") == [orphan]

    failed = await store.get_session(orphan)
    assert failed is not None and failed.status == "ERROR"
    assert failed.status_message == "server restarted"
    untouched = await store.get_session(done)
    assert untouched is not None and untouched.status == "DONE"
    kept = await store.get_session(with_run)
    assert kept is not None and kept.status == "PENDING"
    assert await store.count_pending() == 1


async def test_count_pending_per_user(store: Store) -> None:
    a = await _session_of(store, "alice")
    b = await _session_of(store, "bob")
    await _session_of(store, "bob")
    await store.try_start_run(a, None)
    await store.try_start_run(b, None)
    alice = await store.get_user("alice")
    assert alice is not None
    assert await store.count_pending(alice.id) == 1
    assert await store.count_pending() == 2


async def test_expired_sessions_are_those_past_their_ttl(store: Store) -> None:
    old = await _session_of(store, ttl=-1)
    fresh = await _session_of(store, ttl=3600)
    now = time.time()
    assert await store.expired_sessions(now) == [old]
    assert sorted(await store.expired_sessions(now + 7200)) == sorted([old, fresh])


async def test_delete_session_cascades_to_messages_and_files(store: Store) -> None:
    sid = await _session_of(store)
    keep = await _session_of(store)
    await store.add_message(sid, "user", "hello")
    await store.upsert_file(sid, "a.csv", 5, "user")
    await store.add_message(keep, "user", "stay")
    await store.upsert_file(keep, "b.csv", 7, "assistant")

    assert await store.delete_session(sid)
    assert not await store.delete_session(sid)
    assert await store.get_session(sid) is None
    assert await store.list_messages(sid) == []
    assert await store.list_files(sid) == []
    assert [m.content for m in await store.list_messages(keep)] == ["stay"]
    assert [f.filename for f in await store.list_files(keep)] == ["b.csv"]


# --- messages ----------------------------------------------------------------------------


async def test_concurrent_messages_get_unique_increasing_timestamps(store: Store) -> None:
    sid = await _session_of(store)
    returned: list[float] = []

    async def add(i: int) -> None:
        returned.append((await store.add_message(sid, "tool", f"m{i}", internal=True)).timestamp)

    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(add, i)

    listed = await store.list_messages(sid)
    stamps = [m.timestamp for m in listed]
    assert len(stamps) == 40 and len(set(stamps)) == 40
    assert stamps == sorted(stamps)
    assert sorted(returned) == stamps  # what callers were told is what is stored
    assert all(m.internal and m.role == "tool" for m in listed)
    assert [m.timestamp for m in await store.list_messages(sid, after=stamps[9])] == stamps[10:]
    assert await store.list_messages(sid, after=stamps[-1]) == []


async def test_timestamps_increase_even_when_the_clock_steps_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await _session_of(store)
    monkeypatch.setattr(store_base.time, "time", lambda: 1_700_000_000.0)
    first = await store.add_message(sid, "user", "a")
    second = await store.add_message(sid, "assistant", "b")
    assert second.timestamp > first.timestamp


async def test_a_poller_using_the_last_timestamp_misses_nothing(store: Store) -> None:
    sid = await _session_of(store)
    seen: list[str] = []
    done = anyio.Event()

    async def writer(w: int) -> None:
        for i in range(10):
            await store.add_message(sid, "assistant", f"{w}-{i}")

    async def writers() -> None:
        async with anyio.create_task_group() as tg:
            for w in range(3):
                tg.start_soon(writer, w)
        done.set()

    async def poller() -> None:
        last: float | None = None
        while True:
            finished = done.is_set()
            batch = await store.list_messages(sid, after=last)
            seen.extend(m.content for m in batch)
            if batch:
                last = batch[-1].timestamp
            if finished:
                return
            await anyio.sleep(0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(writers)
        tg.start_soon(poller)

    assert sorted(seen) == sorted(f"{w}-{i}" for w in range(3) for i in range(10))
    assert len(seen) == len(set(seen))


async def test_messages_need_a_session(store: Store) -> None:
    with pytest.raises(SessionNotFound):
        await store.add_message("missing", "user", "hi")


# --- file records ------------------------------------------------------------------------


async def test_file_records_upsert_list_and_delete(store: Store) -> None:
    sid = await _session_of(store)
    await store.upsert_file(sid, "b.csv", 10, "user")
    await store.upsert_file(sid, "a.png", 20, "assistant")
    updated = await store.upsert_file(sid, "b.csv", 15, "assistant")

    assert [(f.filename, f.size) for f in await store.list_files(sid)] == [
        ("a.png", 20),
        ("b.csv", 15),
    ]
    assert await store.get_file(sid, "b.csv") == updated
    assert await store.get_file(sid, "nope") is None
    user = await store.get_user("alice")
    assert user is not None
    assert await store.user_stored_bytes(user.id) == 35

    assert await store.delete_file(sid, "b.csv")
    assert not await store.delete_file(sid, "b.csv")
    assert await store.user_stored_bytes(user.id) == 20
    with pytest.raises(SessionNotFound):
        await store.upsert_file("missing", "x", 1, "user")


# --- persistence (not the memory fake) -------------------------------------------------------


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
async def test_reopening_keeps_data_and_reapplies_no_migration(
    store_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=store_url, data_dir=tmp_path)  # type: ignore[arg-type]
    first = await open_store(settings)
    sid = await _session_of(first)
    await first.add_message(sid, "user", "kept")
    await first.close()

    second = await open_store(settings)
    try:
        assert [m.content for m in await second.list_messages(sid)] == ["kept"]
    finally:
        await second.close()
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        versions = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
    engine.dispose()
    assert [v[0] for v in versions] == ["0003"]


async def test_the_default_database_is_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    store = await open_store(Settings(data_dir=tmp_path / "data"))
    try:
        await store.create_user("alice")
    finally:
        await store.close()
    assert (tmp_path / "data" / "sandbank.db").exists()
