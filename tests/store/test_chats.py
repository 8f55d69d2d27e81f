"""`Chats` and their messages, on every store (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import time

import anyio
import pytest

from sandbank.errors import NotFound, SessionNotFound
from sandbank.store import Store
from tests.store.support import held_run, new_chat, started

pytestmark = pytest.mark.anyio


async def test_chats_start_done_and_list_newest_first(store: Store) -> None:
    user = await store.accounts.create_user("alice")
    before = time.time()
    first = await store.chats.create(user.id, 60)
    second = await store.chats.create(user.id, 60)
    assert first.status == "DONE" and first.status_message is None
    assert before + 60 <= first.ttl <= time.time() + 60
    assert await store.chats.get(first.id) == first
    assert await store.chats.get("00000000-0000-0000-0000-000000000000") is None
    assert [c.id for c in await store.chats.of_user(user.id)] == [second.id, first.id]
    assert await store.chats.count(user.id) == 2
    with pytest.raises(NotFound):
        await store.chats.create("no-such-user", 60)


async def test_expired_chats_are_those_past_their_ttl(store: Store) -> None:
    old = await new_chat(store, ttl=-1)
    fresh = await new_chat(store, ttl=3600)
    now = time.time()
    assert await store.chats.expired(now) == [old]
    assert sorted(await store.chats.expired(now + 7200)) == sorted([old, fresh])


async def test_delete_cascades_to_messages_runs_and_files(store: Store) -> None:
    run = await held_run(store, content="hello")
    sid = run.session_id
    kept = await held_run(store, content="stay")
    await store.file_records.upsert(sid, "a.csv", 5, "user")
    await store.file_records.upsert(kept.session_id, "b.csv", 7, "assistant")

    assert await store.chats.delete(sid)
    assert not await store.chats.delete(sid)
    assert await store.chats.get(sid) is None
    assert await store.chats.messages(sid) == []
    assert await store.file_records.of_session(sid) == []
    assert await store.runs.renew("r1", [run.id, kept.id], 30) == {kept.id: False}
    assert [m.content for m in await store.chats.messages(kept.session_id)] == ["stay"]
    assert [f.filename for f in await store.file_records.of_session(kept.session_id)] == ["b.csv"]


async def test_a_chat_remembers_where_its_sandbox_lives(store: Store) -> None:
    sid = await new_chat(store)
    assert await store.chats.sandbox(sid) == (None, None)
    await store.chats.note_sandbox(sid, "r1", "sandbox-1")
    assert await store.chats.sandbox(sid) == ("r1", "sandbox-1")
    await store.chats.note_sandbox("missing", "r1", "sandbox-2")  # ignored
    assert await store.chats.sandbox("missing") == (None, None)


async def test_the_sandboxes_of_a_users_chats_are_read_at_once(store: Store) -> None:
    first, second = await new_chat(store), await new_chat(store)
    others = await new_chat(store, "bob")
    for n, sid in enumerate((first, others)):
        await store.chats.note_sandbox(sid, "r1", f"sandbox-{n}")
    chat = await store.chats.get(first)
    assert chat is not None
    assert await store.chats.sandboxes_of(chat.user_id) == {first: ("r1", "sandbox-0")}
    assert second not in await store.chats.sandboxes_of(chat.user_id)
    assert await store.chats.sandboxes_of("nobody") == {}


# --- messages (written by the run holding the chat's lease) ----------------------------------


async def test_concurrent_messages_get_unique_increasing_timestamps(store: Store) -> None:
    run = await held_run(store)
    sid = run.session_id
    returned: list[float] = []

    async def add(i: int) -> None:
        added = await store.runs.add_message(run, "tool", f"m{i}", internal=True)
        returned.append(added.timestamp)

    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(add, i)

    listed = await store.chats.messages(sid, after=run.question_at)
    stamps = [m.timestamp for m in listed]
    assert len(stamps) == 40 and len(set(stamps)) == 40
    assert stamps == sorted(stamps)
    assert sorted(returned) == stamps  # what callers were told is what is stored
    assert all(m.internal and m.role == "tool" for m in listed)
    after_tenth = await store.chats.messages(sid, after=stamps[9])
    assert [m.timestamp for m in after_tenth] == stamps[10:]
    assert await store.chats.messages(sid, after=stamps[-1]) == []
    assert (await store.chats.messages(sid))[0].content == "why?"  # the question first


async def test_timestamps_increase_even_when_the_clock_steps_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await held_run(store)
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)  # for every reader of the clock
    first = await store.runs.add_message(run, "tool", "a", True)
    second = await store.runs.add_message(run, "assistant", "b", False)
    assert run.question_at < first.timestamp < second.timestamp


async def test_a_poller_using_the_last_timestamp_misses_nothing(store: Store) -> None:
    run = await held_run(store)
    seen: list[str] = []
    done = anyio.Event()

    async def writer(w: int) -> None:
        for i in range(10):
            await store.runs.add_message(run, "assistant", f"{w}-{i}", False)

    async def writers() -> None:
        async with anyio.create_task_group() as tg:
            for w in range(3):
                tg.start_soon(writer, w)
        done.set()

    async def poller() -> None:
        last: float | None = run.question_at
        while True:
            finished = done.is_set()
            batch = await store.chats.messages(run.session_id, after=last)
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


async def test_messages_need_their_chat(store: Store) -> None:
    run = await held_run(store)
    await store.chats.delete(run.session_id)
    with pytest.raises(SessionNotFound):
        await store.runs.add_message(run, "assistant", "hi", False)


async def test_a_chat_is_titled_by_its_first_question_until_its_user_names_it(store: Store) -> None:
    sid = await new_chat(store)
    assert (await store.chats.get(sid)).title is None  # type: ignore[union-attr]
    run = await started(store, sid, owner="r1", content="x" * 300)
    await store.runs.finish(run, "DONE", None, "done")
    await started(store, sid, owner="r1", content="the second question")
    assert (await store.chats.get(sid)).title == "x" * 200  # type: ignore[union-attr]
    await store.chats.rename(sid, "Sales by region")
    user = await store.accounts.get_user("alice")
    assert user is not None
    (listed,) = await store.chats.of_user(user.id)
    assert listed.title == "Sales by region" == (await store.chats.get(sid)).title  # type: ignore[union-attr]
    await store.chats.rename(sid, None)
    assert (await store.chats.get(sid)).title == "x" * 200  # type: ignore[union-attr]
    with pytest.raises(SessionNotFound):
        await store.chats.rename("00000000-0000-0000-0000-000000000000", "x")


async def test_chats_created_at_once_never_pass_the_users_limit(store: Store) -> None:
    user = await store.accounts.create_user("alice")
    made: list[object] = []

    async def create() -> None:
        made.append(await store.chats.create_within(user.id, 60, 5))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(create)
    assert sum(1 for chat in made if chat is not None) == 5
    assert await store.chats.count(user.id) == 5
    with pytest.raises(NotFound):
        await store.chats.create_within("no-such-user", 60, 5)
