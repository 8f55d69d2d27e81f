"""`RunQueue`: start, claim, renew, take over, cancel, hand back; on every store."""

from __future__ import annotations

import anyio
import pytest

from sandbank.errors import LeaseLost, SessionNotFound
from sandbank.store import Store
from sandbank.store.records import StartTerms
from tests.store.support import LEASE, new_chat, started

pytestmark = pytest.mark.anyio


async def test_a_question_and_its_run_are_stored_together(store: Store) -> None:
    sid = await new_chat(store)
    outcome = await store.runs.start(
        sid, "why?", max_per_user=1, max_total=1, owner="r1", lease_seconds=LEASE
    )
    assert not isinstance(outcome, str)
    question, run = outcome
    assert (question.role, question.content) == ("user", "why?")
    assert run.question_at == question.timestamp
    assert (run.state, run.owner, run.attempts) == ("running", "r1", 1)
    chat = await store.chats.get(sid)
    assert chat is not None and (chat.status, chat.status_message) == ("PENDING", "starting")
    assert await store.chats.messages(sid) == [question]
    assert await store.runs.renew("r1", [run.id], LEASE) == {run.id: False}  # r1 holds it
    assert await store.runs.claim("r2", 10, LEASE) == []


async def test_only_one_of_concurrent_starts_wins(store: Store) -> None:
    sid = await new_chat(store)
    outcomes: list[str] = []

    async def post(i: int) -> None:
        outcome = await store.runs.start(
            sid, f"q{i}", max_per_user=99, max_total=99, owner=None, lease_seconds=LEASE
        )
        outcomes.append(outcome if isinstance(outcome, str) else "started")

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(post, i)

    assert outcomes.count("started") == 1 and outcomes.count("busy") == 19
    assert len(await store.chats.messages(sid)) == 1
    assert await store.runs.request_cancel(sid) == "ended"  # the chat is ERROR "cancelled"
    await started(store, sid)  # ERROR may start again, like DONE
    with pytest.raises(SessionNotFound):
        await started(store, "missing")


async def test_questions_posted_at_once_to_many_chats_never_pass_the_run_limits(
    store: Store,
) -> None:
    chats = [await new_chat(store) for _ in range(8)] + [await new_chat(store, "bob")]
    outcomes: list[str] = []

    async def post(sid: str) -> None:
        outcome = await store.runs.start(
            sid, "why?", max_per_user=2, max_total=3, owner=None, lease_seconds=LEASE
        )
        outcomes.append(outcome if isinstance(outcome, str) else "started")

    async with anyio.create_task_group() as tg:
        for sid in chats:
            tg.start_soon(post, sid)
    assert outcomes.count("started") <= 3
    pending = [c for c in chats if (await store.chats.get(c)).status == "PENDING"]  # type: ignore[union-attr]
    alice = [c for c in pending if c != chats[-1]]
    assert len(alice) == 2 and len(pending) == outcomes.count("started")


async def test_refused_questions_store_nothing(store: Store) -> None:
    alice_1, alice_2, bob = [await new_chat(store, n) for n in ("alice", "alice", "bob")]
    await started(store, alice_1)
    refuse: StartTerms = {"max_per_user": 1, "max_total": 2, "owner": None, "lease_seconds": LEASE}
    assert await store.runs.start(alice_1, "again", **refuse) == "busy"
    assert await store.runs.start(alice_2, "more", **refuse) == "user_limit"
    refuse["max_total"] = 1
    assert await store.runs.start(bob, "mine", **refuse) == "total_limit"
    assert [m.content for m in await store.chats.messages(alice_1)] == ["why?"]
    assert await store.chats.messages(alice_2) == [] and await store.chats.messages(bob) == []
    assert [r.session_id for r in await store.runs.claim("r1", 10, LEASE)] == [alice_1]


async def test_a_run_is_claimed_once_and_taken_over_only_when_its_lease_expires(
    store: Store,
) -> None:
    queued = await started(store, await new_chat(store))
    assert (queued.state, queued.owner, queued.attempts) == ("queued", None, 0)
    [claimed] = await store.runs.claim("r1", 10, LEASE)
    assert (claimed.id, claimed.owner, claimed.attempts) == (queued.id, "r1", 1)
    assert await store.runs.claim("r2", 10, LEASE) == []  # the lease is live

    assert await store.runs.renew("r1", [claimed.id], 0.0) == {claimed.id: False}
    await anyio.sleep(0.01)  # r1 renewed with a lease that ended at once: r1 "died"
    [taken] = await store.runs.claim("r2", 10, LEASE)
    assert (taken.id, taken.owner, taken.attempts) == (claimed.id, "r2", 2)

    # r1 learns it lost the run, and cannot write as if it still held it.
    assert await store.runs.renew("r1", [claimed.id], LEASE) == {}
    with pytest.raises(LeaseLost):
        await store.runs.add_message(claimed, "tool", "{}", True)
    with pytest.raises(LeaseLost):
        await store.runs.set_progress(claimed, "thinking")
    assert not await store.runs.finish(claimed, "ERROR", "stale", "error")
    assert await store.runs.release(claimed, None) == "lost"

    await store.runs.add_message(taken, "assistant", "42", False)
    await store.runs.set_progress(taken, "thinking")
    assert await store.runs.finish(taken, "DONE", None, "done")
    chat = await store.chats.get(taken.session_id)
    assert chat is not None and (chat.status, chat.status_message) == ("DONE", None)
    assert await store.runs.renew("r2", [taken.id], LEASE) == {}  # ended: nobody holds it
    assert await store.runs.request_cancel(taken.session_id) == "none"
    assert [m.content for m in await store.chats.messages(taken.session_id)] == ["why?", "42"]


async def test_a_handed_back_run_is_claimed_again_at_once(store: Store) -> None:
    run = await started(store, await new_chat(store), owner="r1")
    assert await store.runs.release(run, "waiting for a server") == "released"
    chat = await store.chats.get(run.session_id)
    assert chat is not None and chat.status == "PENDING"
    assert chat.status_message == "waiting for a server"
    [again] = await store.runs.claim("r2", 1, LEASE)
    assert (again.id, again.owner, again.attempts) == (run.id, "r2", 2)


async def test_a_run_handed_back_after_its_answer_was_stored_ends_done(store: Store) -> None:
    run = await started(store, await new_chat(store), owner="r1")
    await store.runs.add_message(run, "assistant", "thinking aloud", True)
    await store.runs.add_message(run, "assistant", "42", False)
    assert await store.runs.release(run, "waiting") == "answered"
    chat = await store.chats.get(run.session_id)
    assert chat is not None and (chat.status, chat.status_message) == ("DONE", None)
    assert await store.runs.claim("r2", 5, LEASE) == []


async def test_cancel_is_flagged_for_a_held_run_and_ends_an_unheld_one(store: Store) -> None:
    held = await started(store, await new_chat(store), owner="r1")
    assert await store.runs.request_cancel(held.session_id) == "requested"
    assert await store.runs.renew("r1", [held.id], LEASE) == {held.id: True}

    queued = await started(store, await new_chat(store, "bob"))
    assert await store.runs.request_cancel(queued.session_id) == "ended"
    chat = await store.chats.get(queued.session_id)
    assert chat is not None and (chat.status, chat.status_message) == ("ERROR", "cancelled")
    assert await store.runs.request_cancel(queued.session_id) == "none"
    assert await store.runs.claim("r2", 10, LEASE) == []

    orphaned = await started(store, await new_chat(store, "carol"), owner="dead")
    await store.runs.renew("dead", [orphaned.id], 0.0)
    await anyio.sleep(0.01)
    assert await store.runs.request_cancel(orphaned.session_id) == "ended"
    with pytest.raises(SessionNotFound):
        await store.runs.request_cancel("missing")


async def test_deleting_the_chat_loses_its_run(store: Store) -> None:
    run = await started(store, await new_chat(store), owner="r1")
    assert await store.chats.delete(run.session_id)
    assert await store.runs.renew("r1", [run.id], LEASE) == {}
    assert not await store.runs.finish(run, "DONE", None, "done")
    assert await store.runs.release(run, None) == "lost"
    assert await store.runs.expire_leases() == 0  # gone, not merely unheld


async def test_expire_leases_makes_running_runs_claimable(store: Store) -> None:
    run = await started(store, await new_chat(store), owner="gone")
    assert await store.runs.expire_leases() == 1
    [claimed] = await store.runs.claim("r1", 5, LEASE)
    assert claimed.id == run.id


async def test_a_run_waits_a_moment_for_the_replica_holding_its_sandbox(store: Store) -> None:
    sid = await new_chat(store)
    await store.chats.note_sandbox(sid, "r1", "sandbox-1")
    outcome = await store.runs.start(
        sid, "q", max_per_user=9, max_total=9, owner="r2", lease_seconds=LEASE, affinity=True
    )
    assert not isinstance(outcome, str)
    run = outcome[1]
    assert (run.state, run.owner, run.preferred) == ("queued", None, "r1")
    assert await store.runs.claim("r2", 5, LEASE, affinity_seconds=60) == []
    [claimed] = await store.runs.claim("r1", 5, LEASE, affinity_seconds=60)
    assert claimed.id == run.id

    # Past the wait (r1 dead or full), any replica takes it; without affinity, at once.
    other = await new_chat(store, "bob")
    await store.chats.note_sandbox(other, "r1", "sandbox-3")
    queued = await started(store, other)
    assert queued.preferred is None  # no affinity asked
    late = await store.runs.start(
        other, "again", max_per_user=9, max_total=9, owner=None, lease_seconds=LEASE
    )
    assert late == "busy"
    [taken] = await store.runs.claim("r2", 5, LEASE, affinity_seconds=0)
    assert taken.id == queued.id


async def test_fail_orphan_pending_marks_only_pending_chats_without_a_run(store: Store) -> None:
    orphan, done, with_run = [await new_chat(store) for _ in range(3)]
    # A chat left PENDING with no run in progress, as a server before runs were jobs left it.
    lost = await started(store, orphan, owner="r1")
    assert await store.runs.finish(lost, "PENDING", "running", "error")
    await started(store, with_run)

    assert await store.runs.fail_orphan_pending("server restarted") == [orphan]

    statuses = {sid: await store.chats.get(sid) for sid in (orphan, done, with_run)}
    assert {sid: (c.status, c.status_message) for sid, c in statuses.items() if c} == {
        orphan: ("ERROR", "server restarted"),
        done: ("DONE", None),
        with_run: ("PENDING", "starting"),
    }


async def test_asking_again_runs_the_latest_question_without_storing_it_twice(
    store: Store,
) -> None:
    sid = await new_chat(store)
    args: StartTerms = {"max_per_user": 10, "max_total": 10, "owner": "r1", "lease_seconds": LEASE}
    assert await store.runs.start(sid, None, **args) == "no_question"
    assert (await store.chats.get(sid)).status == "DONE"  # type: ignore[union-attr]
    first = await started(store, sid, owner="r1", content="how many?")
    await store.runs.finish(first, "ERROR", "cancelled", "cancelled")
    again = await store.runs.start(sid, None, **args)
    assert not isinstance(again, str)
    question, run = again
    assert (question.content, question.timestamp) == ("how many?", first.question_at)
    assert run.question_at == first.question_at and run.id != first.id
    assert [m.content for m in await store.chats.messages(sid)] == ["how many?"]
    assert (await store.chats.get(sid)).status == "PENDING"  # type: ignore[union-attr]
    assert await store.runs.start(sid, None, **args) == "busy"
