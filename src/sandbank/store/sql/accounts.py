"""Users and API keys in SQL."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from sandbank.errors import Conflict, NotFound
from sandbank.store.records import ApiKey, User, hash_secret, new_key_id, new_secret, new_user
from sandbank.store.schema import api_keys, sessions, users
from sandbank.store.sql.database import Conn, Database, every, one


class SqlAccounts:
    """The `Accounts` of a SQL database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create_user(self, name: str) -> User:
        user = new_user(name)
        insert = sa.insert(users).values(id=user.id, name=name, created_at=user.created_at)
        await self.db.write(
            lambda conn: conn.execute(insert), refused=lambda: Conflict(f"user {name!r} exists")
        )
        return user

    async def get_user(self, name: str) -> User | None:
        row = await self.db.read(one(sa.select(users).where(users.c.name == name)))
        return None if row is None else _user(row)

    async def get_user_by_id(self, user_id: str) -> User | None:
        row = await self.db.read(one(sa.select(users).where(users.c.id == user_id)))
        return None if row is None else _user(row)

    async def delete_user(self, name: str) -> list[str]:
        def run(conn: Conn) -> list[str]:
            # Locking the user first orders us after (or before) any chat being created for
            # them, so every chat removed is one we report.
            user_id = conn.execute(
                sa.select(users.c.id).where(users.c.name == name).with_for_update()
            ).scalar()
            if user_id is None:
                raise NotFound(f"no user {name!r}")
            # Their chats go with everything they own (messages, runs, files: cascades).
            ids = conn.execute(
                sa.delete(sessions).where(sessions.c.user_id == user_id).returning(sessions.c.id)
            ).scalars()
            removed = list(ids)
            conn.execute(sa.delete(users).where(users.c.id == user_id))  # keys cascade
            return removed

        return await self.db.write(run)

    async def create_key(self, user_name: str) -> tuple[ApiKey, str]:
        secret = new_secret()

        def run(conn: Conn) -> ApiKey:
            user_id = conn.execute(sa.select(users.c.id).where(users.c.name == user_name)).scalar()
            if user_id is None:
                raise NotFound(f"no user {user_name!r}")
            key = ApiKey(new_key_id(), user_id, user_name, time.time())
            conn.execute(
                sa.insert(api_keys).values(
                    id=key.id,
                    user_id=user_id,
                    secret_hash=hash_secret(secret),
                    created_at=key.created_at,
                )
            )
            return key

        return await self.db.write(run), secret

    async def list_keys(self, user_name: str | None = None) -> list[ApiKey]:
        query = (
            sa.select(api_keys, users.c.name.label("user_name"))
            .join(users, users.c.id == api_keys.c.user_id)
            .order_by(api_keys.c.created_at)
        )
        if user_name is not None:
            query = query.where(users.c.name == user_name)
        rows = await self.db.read(every(query))
        return [
            ApiKey(r.id, r.user_id, r.user_name, r.created_at, r.revoked_at, r.last_used_at)
            for r in rows
        ]

    async def revoke_key(self, key_id: str) -> None:
        def run(conn: Conn) -> None:
            found = conn.execute(sa.select(api_keys.c.id).where(api_keys.c.id == key_id)).scalar()
            if found is None:
                raise NotFound(f"no key {key_id!r}")
            conn.execute(
                sa.update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=time.time())
            )

        await self.db.write(run)

    async def authenticate(self, secret: str) -> User | None:
        query = (
            sa.select(users)
            .join(api_keys, api_keys.c.user_id == users.c.id)
            .where(api_keys.c.secret_hash == hash_secret(secret), api_keys.c.revoked_at.is_(None))
        )
        row = await self.db.read(one(query))
        return None if row is None else _user(row)

    async def key_used(self, secret: str, at: float) -> None:
        last = api_keys.c.last_used_at
        update = (
            sa.update(api_keys)
            .where(api_keys.c.secret_hash == hash_secret(secret))
            .where(sa.or_(last.is_(None), last < at))  # replicas may write out of order
            .values(last_used_at=at)
        )
        await self.db.write(lambda conn: conn.execute(update))


def _user(row: sa.Row[Any]) -> User:
    return User(row.id, row.name, row.created_at)
