"""`FileRecords` and pending upload forms, on every store (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

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
