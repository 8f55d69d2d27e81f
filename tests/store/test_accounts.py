"""`Accounts`: users and their keys, on every store (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import pytest

from sandbank.errors import Conflict, NotFound
from sandbank.store import Store
from tests.store.support import held_run, new_chat

pytestmark = pytest.mark.anyio


async def test_user_names_are_unique(store: Store) -> None:
    accounts = store.accounts
    user = await accounts.create_user("alice")
    with pytest.raises(Conflict):
        await accounts.create_user("alice")
    assert await accounts.get_user("alice") == user
    assert await accounts.get_user_by_id(user.id) == user
    assert await accounts.get_user("bob") is None
    assert await accounts.get_user_by_id("nope") is None


async def test_a_key_authenticates_its_user_until_revoked(store: Store) -> None:
    accounts = store.accounts
    alice = await accounts.create_user("alice")
    await accounts.create_user("bob")
    key, secret = await accounts.create_key("alice")
    _, bob_secret = await accounts.create_key("bob")
    assert secret.startswith("sb_") and len(secret) > 40
    assert key.user_id == alice.id and not key.revoked
    assert await accounts.authenticate(secret) == alice
    assert await accounts.authenticate(secret + "x") is None
    assert await accounts.authenticate("") is None
    assert [k.id for k in await accounts.list_keys("alice")] == [key.id]
    assert len(await accounts.list_keys()) == 2

    await accounts.revoke_key(key.id)
    assert await accounts.authenticate(secret) is None
    assert (await accounts.list_keys("alice"))[0].revoked
    assert (await accounts.authenticate(bob_secret)) is not None
    await accounts.revoke_key(key.id)  # revoking twice is harmless
    with pytest.raises(NotFound):
        await accounts.revoke_key("missing")
    with pytest.raises(NotFound):
        await accounts.create_key("carol")


async def test_a_key_remembers_its_latest_use(store: Store) -> None:
    accounts = store.accounts
    await accounts.create_user("alice")
    key, secret = await accounts.create_key("alice")
    other, _ = await accounts.create_key("alice")
    assert (await accounts.list_keys("alice"))[0].last_used_at is None

    await accounts.key_used(secret, 2000.0)
    await accounts.key_used(secret, 1000.0)  # a replica's late write does not go back in time
    await accounts.key_used(secret + "x", 3000.0)  # no such key: nothing happens
    used = {k.id: k.last_used_at for k in await accounts.list_keys("alice")}
    assert used == {key.id: 2000.0, other.id: None}
    await accounts.key_used(secret, 2500.0)
    assert {k.id: k.last_used_at for k in await accounts.list_keys("alice")}[key.id] == 2500.0


async def test_delete_user_removes_everything_they_own(store: Store) -> None:
    run = await held_run(store, "alice")
    s1 = run.session_id
    s2 = await new_chat(store, "alice")
    other = await new_chat(store, "bob")
    _, secret = await store.accounts.create_key("alice")
    await store.runs.add_message(run, "assistant", "hi", False)
    await store.file_records.upsert(s2, "a.csv", 10, "user")

    removed = await store.accounts.delete_user("alice")

    assert sorted(removed) == sorted([s1, s2])
    assert await store.accounts.get_user("alice") is None
    assert await store.accounts.authenticate(secret) is None
    assert await store.accounts.list_keys("alice") == []
    assert await store.chats.get(s1) is None and await store.chats.get(s2) is None
    assert await store.chats.messages(s1) == []
    assert await store.file_records.of_session(s2) == []
    assert await store.runs.expire_leases() == 0  # the run went with its chat
    assert await store.chats.get(other) is not None
    with pytest.raises(NotFound):
        await store.accounts.delete_user("alice")
