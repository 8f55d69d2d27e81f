"""Runs as leased jobs: start, claim, renew, take over, cancel, hand back; on every store."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest

from sandbank.config import Settings
from sandbank.store import Store, open_store
from sandbank.store.base import LeaseLost, Run
from sandbank.store.sql import SqlStore
from tests.store.conftest import _drop_database, _fresh_database

pytestmark = pytest.mark.anyio
LEASE = 30.0


async def _session(store: Store, name: str = "alice") -> str:
    user = await store.get_user(name) or await store.create_user(name)
    return (await store.create_session(user.id, 3600)).id


async def _start(store: Store, sid: str, owner: str | None = None, **limits: int) -> Run:
    started = await store.start_run(
        sid,
        "why?",
        max_per_user=limits.get("max_per_user", 100),
        max_total=limits.get("max_total", 1000),
        owner=owner,
        lease_seconds=LEASE,
    )
    assert not isinstance(started, str), started
    return started[1]


async def test_a_question_and_its_run_are_stored_together(store: Store) -> None:
    sid = await _session(store)
    started = await store.start_run(
        sid, "why?", max_per_user=1, max_total=1, owner="r1", lease_seconds=LEASE
    )
    assert not isinstance(started, str)
    question, run = started
    assert (question.role, question.content) == ("user", "why?")
    assert run.question_at == question.timestamp
    assert (run.state, run.owner, run.attempts) == ("running", "r1", 1)
    session = await store.get_session(sid)
    assert session is not None and session.status == "PENDING"
    assert await store.active_run(sid) == run
    assert await store.get_run(run.id) == run


async def test_refused_questions_store_nothing(store: Store) -> None:
    alice_1, alice_2, bob = [await _session(store, n) for n in ("alice", "alice", "bob")]
    await _start(store, alice_1)
    refuse = {"max_per_user": 1, "max_total": 2, "owner": None, "lease_seconds": LEASE}
    assert await store.start_run(alice_1, "again", **refuse) == "busy"  # type: ignore[arg-type]
    assert await store.start_run(alice_2, "more", **refuse) == "user_limit"  # type: ignore[arg-type]
    refuse["max_total"] = 1
    assert await store.start_run(bob, "mine", **refuse) == "total_limit"  # type: ignore[arg-type]
    assert [m.content for m in await store.list_messages(alice_1)] == ["why?"]
    assert await store.list_messages(alice_2) == [] and await store.list_messages(bob) == []
    assert await store.active_run(alice_2) is None and await store.active_run(bob) is None


async def test_a_run_is_claimed_once_and_taken_over_only_when_its_lease_expires(
    store: Store,
) -> None:
    queued = await _start(store, await _session(store))
    assert (queued.state, queued.owner, queued.attempts) == ("queued", None, 0)
    [claimed] = await store.claim_runs("r1", 10, LEASE)
    assert (claimed.id, claimed.owner, claimed.attempts) == (queued.id, "r1", 1)
    assert await store.claim_runs("r2", 10, LEASE) == []  # the lease is live

    assert await store.renew_runs("r1", [claimed.id], 0.0) == {claimed.id: False}
    await anyio.sleep(0.01)  # r1 renewed with a lease that ended at once: r1 "died"
    [taken] = await store.claim_runs("r2", 10, LEASE)
    assert (taken.id, taken.owner, taken.attempts) == (claimed.id, "r2", 2)

    # r1 learns it lost the run, and cannot write as if it still held it.
    assert await store.renew_runs("r1", [claimed.id], LEASE) == {}
    with pytest.raises(LeaseLost):
        await store.add_message(claimed.session_id, "tool", "{}", True, fence=claimed)
    with pytest.raises(LeaseLost):
        await store.set_progress(claimed, "thinking")
    assert not await store.finish_run(claimed, "ERROR", "stale", "error")
    assert await store.release_run(claimed, None) == "lost"

    await store.add_message(taken.session_id, "assistant", "42", False, fence=taken)
    await store.set_progress(taken, "thinking")
    assert await store.finish_run(taken, "DONE", None, "done")
    session = await store.get_session(taken.session_id)
    assert session is not None and (session.status, session.status_message) == ("DONE", None)
    assert await store.active_run(taken.session_id) is None
    ended = await store.get_run(taken.id)
    assert ended is not None and ended.state == "done"
    assert [m.content for m in await store.list_messages(taken.session_id)] == ["why?", "42"]


async def test_a_handed_back_run_is_claimed_again_at_once(store: Store) -> None:
    run = await _start(store, await _session(store), owner="r1")
    assert await store.release_run(run, "waiting for a server") == "released"
    session = await store.get_session(run.session_id)
    assert session is not None and session.status == "PENDING"
    assert session.status_message == "waiting for a server"
    [again] = await store.claim_runs("r2", 1, LEASE)
    assert (again.id, again.owner, again.attempts) == (run.id, "r2", 2)


async def test_cancel_is_flagged_for_a_held_run_and_ends_an_unheld_one(store: Store) -> None:
    held = await _start(store, await _session(store), owner="r1")
    assert await store.request_cancel(held.session_id) == "requested"
    assert await store.renew_runs("r1", [held.id], LEASE) == {held.id: True}

    queued = await _start(store, await _session(store, "bob"))
    assert await store.request_cancel(queued.session_id) == "ended"
    session = await store.get_session(queued.session_id)
    assert session is not None and (session.status, session.status_message) == (
        "ERROR",
        "cancelled",
    )
    assert await store.request_cancel(queued.session_id) == "none"
    assert await store.claim_runs("r2", 10, LEASE) == []

    orphaned = await _start(store, await _session(store, "carol"), owner="dead")
    await store.renew_runs("dead", [orphaned.id], 0.0)
    await anyio.sleep(0.01)
    assert await store.request_cancel(orphaned.session_id) == "ended"


async def test_deleting_the_session_loses_its_run(store: Store) -> None:
    run = await _start(store, await _session(store), owner="r1")
    assert await store.delete_session(run.session_id)
    assert await store.renew_runs("r1", [run.id], LEASE) == {}
    assert not await store.finish_run(run, "DONE", None, "done")
    assert await store.get_run(run.id) is None


async def test_expire_leases_makes_running_runs_claimable(store: Store) -> None:
    run = await _start(store, await _session(store), owner="gone")
    assert await store.expire_leases() == 1
    [claimed] = await store.claim_runs("r1", 5, LEASE)
    assert claimed.id == run.id


# --- two replicas on one database ---------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
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
    settings = Settings(database_url=shared_url, data_dir=tmp_path)  # type: ignore[arg-type]
    one, two = await open_store(settings), await open_store(settings)
    try:
        yield one, two
    finally:
        await one.close()
        await two.close()


async def test_two_claimers_racing_claim_each_of_100_runs_exactly_once(
    replicas: tuple[Store, Store],
) -> None:
    one, two = replicas
    expected = {(await _start(one, await _session(one))).id for _ in range(100)}
    claims: dict[str, list[str]] = {"r1": [], "r2": []}

    async def claimer(store: Store, name: str) -> None:
        for _ in range(200):  # bounded: 100 runs at 1-3 a claim
            got = await store.claim_runs(name, 3, LEASE)
            claims[name] += [r.id for r in got]
            if not got and len(claims["r1"]) + len(claims["r2"]) >= 100:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(claimer, one, "r1")
        tg.start_soon(claimer, two, "r2")
    everything = claims["r1"] + claims["r2"]
    assert sorted(everything) == sorted(expected)  # each once, none twice
    if isinstance(one, SqlStore) and not one._engines.is_sqlite:
        # Both took part (SQLite's one writer may let one claimer take everything).
        assert claims["r1"] and claims["r2"]


async def test_run_limits_hold_across_replicas(replicas: tuple[Store, Store]) -> None:
    one, two = replicas
    sessions = [await _session(one, f"user{i}") for i in range(12)]
    outcomes: list[str] = []

    async def post(store: Store, sid: str) -> None:
        started = await store.start_run(
            sid, "q", max_per_user=5, max_total=3, owner=None, lease_seconds=LEASE
        )
        outcomes.append(started if isinstance(started, str) else "started")

    async with anyio.create_task_group() as tg:
        for index, sid in enumerate(sessions):
            tg.start_soon(post, (one, two)[index % 2], sid)
    assert outcomes.count("started") == 3
    assert outcomes.count("total_limit") == 9
    assert await one.count_pending() == 3


def test_replicas_starting_together_migrate_once(postgres_server: str) -> None:
    url, name = _fresh_database(postgres_server)
    opened: list[SqlStore] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(3)

    def start() -> None:
        try:
            gate.wait(timeout=10)
            opened.append(SqlStore.open(url))
        except BaseException as exc:
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
            assert versions == [("0003",)]
    finally:
        for store in opened:
            store._engines.dispose()
        _drop_database(postgres_server, name)


async def test_upload_forms_are_noted_until_dropped_and_go_with_their_session(
    store: Store,
) -> None:
    sid = await _session(store)
    await store.note_upload(sid, "a.csv", 100.0)
    await store.note_upload(sid, "a.csv", 200.0)  # a second form for the same name
    await store.note_upload(sid, "b.csv", 300.0)
    assert await store.pending_uploads(sid) == {"a.csv": 200.0, "b.csv": 300.0}
    await store.drop_upload(sid, "a.csv")
    assert await store.pending_uploads(sid) == {"b.csv": 300.0}
    await store.delete_session(sid)
    assert await store.pending_uploads(sid) == {}


async def test_a_run_waits_a_moment_for_the_replica_holding_its_sandbox(store: Store) -> None:
    sid = await _session(store)
    assert await store.session_sandbox(sid) == (None, None)
    await store.note_sandbox(sid, "r1", "sandbox-1")
    assert await store.session_sandbox(sid) == ("r1", "sandbox-1")
    await store.note_sandbox("missing", "r1", "sandbox-2")  # ignored

    started = await store.start_run(
        sid, "q", max_per_user=9, max_total=9, owner="r2", lease_seconds=LEASE, affinity=True
    )
    assert not isinstance(started, str)
    run = started[1]
    assert (run.state, run.owner, run.preferred) == ("queued", None, "r1")
    assert await store.claim_runs("r2", 5, LEASE, affinity_seconds=60) == []
    [claimed] = await store.claim_runs("r1", 5, LEASE, affinity_seconds=60)
    assert claimed.id == run.id

    # Past the wait (r1 dead or full), any replica takes it; without affinity, at once.
    other = await _session(store, "bob")
    await store.note_sandbox(other, "r1", "sandbox-3")
    queued = await _start(store, other)
    assert queued.preferred is None  # no affinity asked
    late = await store.start_run(
        other, "again", max_per_user=9, max_total=9, owner=None, lease_seconds=LEASE
    )
    assert late == "busy"
    [taken] = await store.claim_runs("r2", 5, LEASE, affinity_seconds=0)
    assert taken.id == queued.id


async def test_a_run_handed_back_after_its_answer_was_stored_ends_done(store: Store) -> None:
    run = await _start(store, await _session(store), owner="r1")
    await store.add_message(run.session_id, "assistant", "thinking aloud", True, fence=run)
    await store.add_message(run.session_id, "assistant", "42", False, fence=run)
    assert await store.release_run(run, "waiting") == "answered"
    session = await store.get_session(run.session_id)
    assert session is not None and (session.status, session.status_message) == ("DONE", None)
    assert await store.claim_runs("r2", 5, LEASE) == []
