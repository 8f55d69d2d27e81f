"""Users and API keys in memory."""

from __future__ import annotations

import dataclasses
import time

from sandbank.errors import Conflict, NotFound
from sandbank.store.memory.state import MemoryState
from sandbank.store.records import ApiKey, User, hash_secret, new_key_id, new_secret, new_user


class MemoryAccounts:
    """The `Accounts` of a `MemoryState`."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    def _named(self, name: str) -> User | None:
        return next((u for u in self.state.users.values() if u.name == name), None)

    async def create_user(self, name: str) -> User:
        if self._named(name) is not None:
            raise Conflict(f"user {name!r} exists")
        user = new_user(name)
        self.state.users[user.id] = user
        return user

    async def get_user(self, name: str) -> User | None:
        return self._named(name)

    async def get_user_by_id(self, user_id: str) -> User | None:
        return self.state.users.get(user_id)

    async def delete_user(self, name: str) -> list[str]:
        user = self._named(name)
        if user is None:
            raise NotFound(f"no user {name!r}")
        ids = [c.id for c in self.state.chats.values() if c.user_id == user.id]
        for sid in ids:
            self.state.drop_chat(sid)
        keys = self.state.keys
        self.state.keys = {k: v for k, v in keys.items() if v[0].user_id != user.id}
        del self.state.users[user.id]
        return ids

    async def create_key(self, user_name: str) -> tuple[ApiKey, str]:
        user = self._named(user_name)
        if user is None:
            raise NotFound(f"no user {user_name!r}")
        secret = new_secret()
        key = ApiKey(new_key_id(), user.id, user.name, time.time())
        self.state.keys[key.id] = (key, hash_secret(secret))
        return key, secret

    async def list_keys(self, user_name: str | None = None) -> list[ApiKey]:
        keys = [k for k, _ in self.state.keys.values()]
        if user_name is not None:
            keys = [k for k in keys if k.user_name == user_name]
        return sorted(keys, key=lambda k: k.created_at)

    async def revoke_key(self, key_id: str) -> None:
        if key_id not in self.state.keys:
            raise NotFound(f"no key {key_id!r}")
        key, digest = self.state.keys[key_id]
        if key.revoked_at is None:
            self.state.keys[key_id] = (dataclasses.replace(key, revoked_at=time.time()), digest)

    async def authenticate(self, secret: str) -> User | None:
        digest = hash_secret(secret)
        for key, stored in self.state.keys.values():
            if stored == digest and not key.revoked:
                return self.state.users.get(key.user_id)
        return None

    async def key_used(self, secret: str, at: float) -> None:
        digest = hash_secret(secret)
        for key_id, (key, stored) in self.state.keys.items():
            if stored == digest and (key.last_used_at or 0.0) < at:
                self.state.keys[key_id] = (dataclasses.replace(key, last_used_at=at), digest)
