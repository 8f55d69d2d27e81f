"""`FileRecords` and pending upload forms, on every store (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandbank.errors import SessionNotFound
from sandbank.store import Store
from tests.store.support import new_chat

pytestmark = pytest.mark.anyio


async def test_file_records_are_upserted_and_listed_by_name(store: Store) -> None:
    records = store.file_records
    sid = await new_chat(store)
    other = await new_chat(store)
    await records.upsert(sid, "b.csv", 10, "user")
    await records.upsert(sid, "a.png", 20, "assistant")
    updated = await records.upsert(sid, "b.csv", 15, "assistant")
    await records.upsert(other, "c.txt", 5, "user")
    await records.upsert(await new_chat(store, "bob"), "d.txt", 100, "user")

    assert [(f.filename, f.size) for f in await records.of_session(sid)] == [
        ("a.png", 20),
        ("b.csv", 15),
    ]
    assert await records.get(sid, "b.csv") == updated
    assert await records.get(sid, "nope") is None
    user = await store.accounts.get_user("alice")
    assert user is not None
    assert await records.stored_bytes(user.id) == 40
    with pytest.raises(SessionNotFound):
        await records.upsert("missing", "x", 1, "user")


async def test_upload_forms_are_noted_until_dropped_and_go_with_their_chat(store: Store) -> None:
    records = store.file_records
    sid = await new_chat(store)
    await records.note_upload(sid, "a.csv", 100.0)
    await records.note_upload(sid, "a.csv", 200.0)  # a second form for the same name
    await records.note_upload(sid, "b.csv", 300.0)
    assert await records.pending_uploads(sid) == {"a.csv": 200.0, "b.csv": 300.0}
    await records.drop_upload(sid, "a.csv")
    assert await records.pending_uploads(sid) == {"b.csv": 300.0}
    await store.chats.delete(sid)
    assert await records.pending_uploads(sid) == {}
    with pytest.raises(SessionNotFound):
        await records.note_upload(sid, "c.csv", 400.0)


async def test_a_deleted_record_and_its_upload_form_are_gone(store: Store) -> None:
    sid = await new_chat(store)
    await store.file_records.upsert(sid, "a.csv", 3, "user")
    await store.file_records.note_upload(sid, "a.csv", 9e9)
    assert await store.file_records.delete(sid, "a.csv") is True
    assert await store.file_records.get(sid, "a.csv") is None
    assert await store.file_records.pending_uploads(sid) == {}
    assert await store.file_records.delete(sid, "a.csv") is False


async def test_reservations_count_with_stored_files_and_never_pass_the_quota_together(
    store: Store,
) -> None:
    """Many writers reserving at once: exactly as many fit as the quota holds."""
    records = store.file_records
    sid = await new_chat(store)
    await records.upsert(sid, "old.csv", 100, "user")
    later = time.time() + 600

    async def one(i: int) -> bool:
        return await records.reserve(f"r{i}", sid, f"f{i}.csv", 100, 1000, later)

    granted = await asyncio.gather(*(one(i) for i in range(20)))
    assert sum(granted) == 9  # 100 stored + 9 x 100 reserved = 1000
    # A reservation of an id grows it (or stays as it was when the quota says no).
    first = granted.index(True)
    assert not await records.reserve(f"r{first}", sid, f"f{first}.csv", 200, 1000, later)
    await records.release(f"r{first}")
    assert await records.reserve(f"r{first}", sid, f"f{first}.csv", 100, 1000, later)
    # A file replacing another counts only once: the old one's bytes are not counted.
    assert await records.reserve("again", sid, "old.csv", 100, 1000, later)
    assert not await records.reserve("again", sid, "old.csv", 200, 1000, later)
    # Refused, it kept its 100: nothing else fits.
    assert not await records.reserve("one more", sid, "x.csv", 1, 1000, later)
    await records.release(f"r{first}")
    assert await records.reserve("again", sid, "old.csv", 200, 1000, later)
    committed = await records.commit("again", sid, "old.csv", 150, "user")
    assert committed.size == 150 and (await records.get(sid, "old.csv")) == committed
    user = await store.accounts.get_user("alice")
    assert user is not None and await records.stored_bytes(user.id) == 150


async def test_an_expired_reservation_stops_counting_and_reservations_go_with_their_chat(
    store: Store,
) -> None:
    records = store.file_records
    sid = await new_chat(store)
    assert await records.reserve("gone", sid, "a", 900, 1000, time.time() - 1)
    assert await records.reserve("live", sid, "b", 900, 1000, time.time() + 600)
    assert not await records.reserve("more", sid, "c", 200, 1000, time.time() + 600)
    await store.chats.delete(sid)
    other = await new_chat(store)
    assert await records.reserve("more", other, "c", 1000, 1000, time.time() + 600)
    with pytest.raises(SessionNotFound):
        await records.reserve("x", sid, "c", 1, 1000, time.time() + 600)
