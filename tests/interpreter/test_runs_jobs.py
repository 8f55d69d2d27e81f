"""Runs of two replicas in one process, on one store: takeover, fencing, cancel, hand-back.

The store is the in-memory one (the SQL stores pass the same contract in tests/store), the
sandboxes run on the fake backend and the model is scripted: these tests check the replicas' logic, fast; the
HTTP tests in test_replicas.py check it again with real processes and PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from sandbank.agent.model import ChatMessage, ModelReply, ToolSpec, UserMessage
from sandbank.agent.scripted import ScriptedModel, answer
from sandbank.config import Settings
from sandbank.files.memory import MemoryObjectStore
from sandbank.interpreter.files import SessionFiles
from sandbank.interpreter.runs import (
    FRESH_SANDBOX,
    HANDED_BACK,
    RESUME_NOTE,
    WORKER_LOST,
    Runs,
)
from sandbank.sandbox.backends.fake import FakeBackend
from sandbank.sandbox.local import LocalSandboxes
from sandbank.store.memory import memory_store

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def hanging() -> ScriptedModel:
    async def reply(messages: list[ChatMessage], tools: list[ToolSpec]) -> ModelReply:
        await anyio.sleep(3600)
        raise AssertionError("unreachable")

    return ScriptedModel(reply)


def answering(text: str) -> ScriptedModel:
    return ScriptedModel(lambda messages, tools: answer(text))


class Fleet:
    def __init__(self, tmp_path: Path) -> None:
        self.settings = Settings(
            data_dir=tmp_path,
            run_poll_seconds=0.05,
            run_lease_seconds=5,
            shutdown_grace_seconds=0,
            pool_size=0,
        )
        self.store = memory_store()
        self.files = SessionFiles(self.store, MemoryObjectStore(), self.settings)
        self.replicas: list[Runs] = []
        self.backends: dict[str, FakeBackend] = {}
        self.sandboxes: list[LocalSandboxes] = []

    async def replica(self, model: ScriptedModel, name: str) -> Runs:
        """A replica with sandboxes of its own (on the fake backend: they run nothing)."""
        own = self.settings.model_copy(update={"data_dir": self.settings.data_dir / name})
        backend = self.backends[name] = FakeBackend(own)
        sandboxes = LocalSandboxes(own, backend)
        await sandboxes.start()
        self.sandboxes.append(sandboxes)
        runs = Runs(self.store, self.files, sandboxes, model, self.settings, name)
        self.replicas.append(runs)
        return runs

    async def question(self, runs: Runs, content: str = "why?") -> str:
        accounts = self.store.accounts
        user = await accounts.get_user("alice") or await accounts.create_user("alice")
        session = await self.store.chats.create(user.id, 3600)
        await runs.begin(session, content)
        return session.id

    async def wait_until_ended(self, sid: str) -> tuple[str, str | None]:
        with anyio.fail_after(5):
            while True:
                session = await self.store.chats.get(sid)
                assert session is not None
                if session.status != "PENDING":
                    return session.status, session.status_message
                await anyio.sleep(0.01)


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    made = Fleet(tmp_path)
    yield made
    tasks = [a.task for runs in made.replicas for a in runs.active.values()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)
    for sandboxes in made.sandboxes:
        await sandboxes.close()


async def test_a_run_taken_over_is_resumed_and_its_old_replica_writes_nothing(
    fleet: Fleet,
) -> None:
    stalled = await fleet.replica(hanging(), "r1")
    resumer_model = answering("resumed")
    resumer = await fleet.replica(resumer_model, "r2")
    sid = await fleet.question(stalled)
    await anyio.sleep(0.05)  # r1 is waiting for its model
    run, stalled_task = stalled.active[sid].run, stalled.active[sid].task
    await fleet.store.runs.renew("r1", [run.id], -1)  # r1 stalls past its lease

    await resumer.tick()  # r2 claims the run (attempt 2) and resumes it
    assert await fleet.wait_until_ended(sid) == ("DONE", None)
    messages, _ = resumer_model.calls[0]
    assert messages[-1] == UserMessage(RESUME_NOTE.format(sandbox=FRESH_SANDBOX))
    assert UserMessage("why?") in messages  # the question, as history

    await stalled.tick()  # r1 learns it lost the run, and stops it
    await asyncio.wait({stalled_task}, timeout=5)
    assert stalled_task.done() and not stalled.active
    contents = [m.content for m in await fleet.store.chats.messages(sid)]
    assert contents[0] == "why?" and contents[-1] == "resumed"
    assert await fleet.store.runs.request_cancel(sid) == "none"  # no run left


async def test_a_cancel_posted_to_another_replica_reaches_the_one_running(
    fleet: Fleet,
) -> None:
    running = await fleet.replica(hanging(), "r1")
    other = await fleet.replica(answering("unused"), "r2")
    sid = await fleet.question(running)
    run_id = running.active[sid].run.id
    ticking = asyncio.create_task(running.serve_forever())
    try:
        with anyio.fail_after(5):
            await other.cancel(sid)
        session = await fleet.store.chats.get(sid)
        assert session is not None and (session.status, session.status_message) == (
            "ERROR",
            "cancelled",
        )
    finally:
        ticking.cancel()
    assert await fleet.store.runs.renew("r1", [run_id], 5) == {}  # ended: r1 holds it no more


async def test_shutdown_hands_a_run_back_and_another_replica_finishes_it(
    fleet: Fleet,
) -> None:
    leaving = await fleet.replica(hanging(), "r1")
    staying = await fleet.replica(answering("finished elsewhere"), "r2")
    sid = await fleet.question(leaving)
    await anyio.sleep(0.05)
    run_id = leaving.active[sid].run.id
    await leaving.shutdown(grace_s=0.05)
    session = await fleet.store.chats.get(sid)
    assert session is not None and (session.status, session.status_message) == (
        "PENDING",
        HANDED_BACK,
    )
    assert await fleet.store.runs.renew("r1", [run_id], 5) == {}  # queued, held by nobody

    await leaving.tick()  # a stopping replica claims nothing
    assert not leaving.active
    await staying.tick()
    assert await fleet.wait_until_ended(sid) == ("DONE", None)


async def test_a_post_to_a_full_replica_is_queued_for_one_with_room(fleet: Fleet) -> None:
    fleet.settings.runs_per_replica = 1
    full = await fleet.replica(hanging(), "r1")
    free = await fleet.replica(answering("from r2"), "r2")
    await fleet.question(full)
    sid = await fleet.question(full)  # r1 has no room: queued
    assert sid not in full.active
    await free.tick()
    assert await fleet.wait_until_ended(sid) == ("DONE", None)


async def test_a_run_lost_too_often_ends_as_an_error(fleet: Fleet) -> None:
    sid = await fleet.question(await fleet.replica(hanging(), "r0"))
    for index in range(1, 4):
        await fleet.store.runs.expire_leases()
        claimed = await fleet.store.runs.claim(f"dead{index}", 1, 5)
        assert [r.session_id for r in claimed] == [sid]
    await fleet.store.runs.expire_leases()
    await (await fleet.replica(answering("never"), "r9")).tick()
    assert await fleet.wait_until_ended(sid) == ("ERROR", WORKER_LOST)


async def test_a_question_posted_elsewhere_runs_where_the_sessions_sandbox_is(
    fleet: Fleet,
) -> None:
    home, elsewhere = (
        await fleet.replica(answering("at home"), "r1"),
        await fleet.replica(answering("away"), "r2"),
    )
    sid = await fleet.question(home)
    assert await fleet.wait_until_ended(sid) == ("DONE", None)
    session = await fleet.store.chats.get(sid)
    assert session is not None

    await elsewhere.begin(session, "again")  # queued for r1, which holds the sandbox
    await elsewhere.tick()
    assert not elsewhere.active
    await home.tick()
    assert await fleet.wait_until_ended(sid) == ("DONE", None)
    assert len(fleet.backends["r1"].sandboxes) == 1 and not fleet.backends["r2"].sandboxes

    # r1 stops ticking (dead): after the wait, r2 takes the session's next question.
    session = await fleet.store.chats.get(sid)
    assert session is not None
    await elsewhere.begin(session, "and again")
    await anyio.sleep(3 * fleet.settings.run_poll_seconds + 0.05)
    await elsewhere.tick()
    assert await fleet.wait_until_ended(sid) == ("DONE", None)
    assert (await fleet.store.chats.messages(sid))[-1].content == "away"


async def test_an_answer_already_stored_is_never_given_twice(fleet: Fleet) -> None:
    """Stopped (or killed) between storing its answer and recording its end, a run ends DONE."""
    stopping = await fleet.replica(hanging(), "r1")
    sid = await fleet.question(stopping)
    await anyio.sleep(0.05)
    run = stopping.active[sid].run
    await fleet.store.runs.add_message(run, "assistant", "the answer", False)
    await stopping.shutdown(grace_s=0)  # not handed back: it has answered
    assert await fleet.wait_until_ended(sid) == ("DONE", None)

    model = answering("a second answer")
    dead = await fleet.replica(hanging(), "r2")
    other = await fleet.question(dead)
    await anyio.sleep(0.05)
    dead_run = dead.active[other].run
    await fleet.store.runs.add_message(dead_run, "assistant", "first", False)
    await fleet.store.runs.expire_leases()  # r2 died before recording the end
    await (await fleet.replica(model, "r3")).tick()
    assert await fleet.wait_until_ended(other) == ("DONE", None)
    assert model.calls == []
    answers = [m.content for m in await fleet.store.chats.messages(other) if m.role == "assistant"]
    assert answers == ["first"]


async def test_a_sandbox_on_another_replicas_machine_is_not_said_to_be_gone(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state of a chat's sandbox: running where it lives; left out by a replica that cannot
    see it (local sandboxes) or cannot list them now; none for a chat that never had one."""
    here = await fleet.replica(answering("done"), "r1")
    elsewhere = await fleet.replica(answering("unused"), "r2")
    asked = await fleet.question(here)
    assert await fleet.wait_until_ended(asked) == ("DONE", None)
    user = await fleet.store.accounts.get_user("alice")
    assert user is not None
    new = (await fleet.store.chats.create(user.id, 3600)).id
    assert await here.sandbox_states(user.id, [asked, new]) == {asked: "running", new: "none"}
    assert await elsewhere.sandbox_states(user.id, [asked, new]) == {new: "none"}

    async def hangs(tenant: str) -> list[object]:
        await anyio.sleep(3600)
        return []

    monkeypatch.setattr("sandbank.interpreter.runs.STATE_READ_S", 0.05)
    monkeypatch.setattr(fleet.sandboxes[0], "list_sessions", hangs)
    with anyio.fail_after(2):
        assert await here.sandbox_states(user.id, [asked]) == {}
    await here.stop(asked, None)  # its sandbox ended: this replica would see it
    monkeypatch.undo()
    assert await here.sandbox_states(user.id, [asked]) == {asked: "none"}
