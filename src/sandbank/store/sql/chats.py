"""Chats (the `sessions` table) and their messages in SQL, with the row helpers that other
aggregates' transactions compose: the chat's lock, its status, appending a message."""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa

from sandbank.errors import NotFound, SessionNotFound
from sandbank.store.records import (
    TITLE_MAX,
    ChatSession,
    Message,
    Role,
    SessionStatus,
    new_chat,
    next_timestamp,
)
from sandbank.store.schema import messages, sessions, users
from sandbank.store.sql.database import Conn, Database, every, one, scalar_int


class SqlChats:
    """The `Chats` of a SQL database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, user_id: str, ttl_seconds: float) -> ChatSession:
        chat = await self._create(user_id, ttl_seconds, None)
        assert chat is not None
        return chat

    async def create_within(
        self, user_id: str, ttl_seconds: float, limit: int
    ) -> ChatSession | None:
        return await self._create(user_id, ttl_seconds, limit)

    async def _create(
        self, user_id: str, ttl_seconds: float, limit: int | None
    ) -> ChatSession | None:
        chat = new_chat(user_id, ttl_seconds)
        insert = sa.insert(sessions).values(
            id=chat.id,
            user_id=user_id,
            status=chat.status,
            status_message=None,
            created_at=chat.created_at,
            ttl=chat.ttl,
        )

        def create(conn: Conn) -> ChatSession | None:
            if limit is not None:
                lock_user(conn, user_id)  # counting, then inserting, is one step per user
                count = sa.select(sa.func.count()).where(sessions.c.user_id == user_id)
                if int(conn.execute(count).scalar() or 0) >= limit:
                    return None
            conn.execute(insert)
            return chat

        return await self.db.write(create, refused=lambda: NotFound(f"no user with id {user_id!r}"))

    async def get(self, session_id: str) -> ChatSession | None:
        row = await self.db.read(one(_titled().where(sessions.c.id == session_id)))
        return None if row is None else _chat(row)

    async def of_user(self, user_id: str) -> list[ChatSession]:
        query = (
            _titled().where(sessions.c.user_id == user_id).order_by(sessions.c.created_at.desc())
        )
        return [_chat(r) for r in await self.db.read(every(query))]

    async def rename(self, session_id: str, title: str | None) -> None:
        update = sa.update(sessions).where(sessions.c.id == session_id).values(title=title)

        def rename(conn: Conn) -> None:
            if not conn.execute(update).rowcount:
                raise SessionNotFound(f"no session {session_id}")

        await self.db.write(rename)

    async def count(self, user_id: str) -> int:
        query = sa.select(sa.func.count()).where(sessions.c.user_id == user_id)
        return await self.db.read(scalar_int(query))

    async def delete(self, session_id: str) -> bool:
        delete = sa.delete(sessions).where(sessions.c.id == session_id)  # the rest cascades
        return await self.db.write(lambda conn: bool(conn.execute(delete).rowcount))

    async def expired(self, now: float) -> list[str]:
        query = sa.select(sessions.c.id).where(sessions.c.ttl <= now).order_by(sessions.c.ttl)
        return [r.id for r in await self.db.read(every(query))]

    async def messages(self, session_id: str, after: float | None = None) -> list[Message]:
        query = sa.select(messages).where(messages.c.session_id == session_id)
        if after is not None:
            query = query.where(messages.c.timestamp > after)
        rows = await self.db.read(every(query.order_by(messages.c.timestamp)))
        return [
            Message(r.session_id, r.timestamp, cast(Role, r.role), r.content, bool(r.internal))
            for r in rows
        ]

    async def note_sandbox(self, session_id: str, replica: str, sandbox_id: str) -> None:
        update = (
            sa.update(sessions)
            .where(sessions.c.id == session_id)
            .values(replica=replica, sandbox_id=sandbox_id)
        )
        await self.db.write(lambda conn: conn.execute(update))

    async def sandbox(self, session_id: str) -> tuple[str | None, str | None]:
        query = sa.select(sessions.c.replica, sessions.c.sandbox_id).where(
            sessions.c.id == session_id
        )
        row = await self.db.read(one(query))
        return (None, None) if row is None else (row.replica, row.sandbox_id)

    async def sandboxes_of(self, user_id: str) -> dict[str, tuple[str, str]]:
        query = sa.select(sessions.c.id, sessions.c.replica, sessions.c.sandbox_id).where(
            sessions.c.user_id == user_id, sessions.c.sandbox_id.is_not(None)
        )
        rows = await self.db.read(every(query))
        return {r.id: (r.replica or "", r.sandbox_id) for r in rows}


# --- row helpers: parts of transactions that change a chat along with another aggregate ------


def _locked(
    conn: Conn, column: sa.Column[Any], where: sa.ColumnElement[bool]
) -> sa.Row[Any] | None:
    """The row's `column`, its row locked until commit (None when there is no such row)."""
    return conn.execute(
        sa.select(column)
        .where(where)
        .with_for_update()  # ignored by SQLite, whose writer already holds the database lock
    ).first()


def lock_user(conn: Conn, user_id: str) -> None:
    """Lock the user's row until commit (`NotFound` when missing): what is counted against the
    user's quotas stays as counted until the transaction commits."""
    if _locked(conn, users.c.id, users.c.id == user_id) is None:
        raise NotFound(f"no user with id {user_id!r}")


def lock_chat(conn: Conn, session_id: str) -> float | None:
    """Lock the chat's row until commit (`SessionNotFound` when missing); its latest message
    timestamp, from which the next one is assigned."""
    row = _locked(conn, sessions.c.last_message_at, sessions.c.id == session_id)
    if row is None:
        raise SessionNotFound(f"no session {session_id}")
    return cast(float | None, row.last_message_at)


def set_status(conn: Conn, session_id: str, status: SessionStatus, message: str | None) -> None:
    conn.execute(
        sa.update(sessions)
        .where(sessions.c.id == session_id)
        .values(status=status, status_message=message)
    )


def insert_message(
    conn: Conn, session_id: str, last: float | None, role: Role, content: str, internal: bool
) -> Message:
    """Append a message to a chat whose row the caller locked (its latest stamp: `last`).

    The row lock (PostgreSQL) or the write lock (SQLite) is held until commit, so timestamps
    are assigned and become visible in the same order: a reader polling with the last
    timestamp it saw cannot miss a message."""
    stamp = next_timestamp(last)
    conn.execute(
        sa.update(sessions).where(sessions.c.id == session_id).values(last_message_at=stamp)
    )
    conn.execute(
        sa.insert(messages).values(
            session_id=session_id, timestamp=stamp, role=role, content=content, internal=internal
        )
    )
    return Message(session_id, stamp, role, content, internal)


def _titled() -> sa.Select[Any]:
    """The chats with their shown title: the given name, else the first question."""
    first_question = (
        sa.select(sa.func.substr(messages.c.content, 1, TITLE_MAX))
        .where(messages.c.session_id == sessions.c.id, messages.c.role == "user")
        .order_by(messages.c.timestamp)
        .limit(1)
        .scalar_subquery()
    )
    shown = sa.func.coalesce(sessions.c.title, first_question).label("shown_title")
    return sa.select(sessions, shown)


def _chat(row: sa.Row[Any]) -> ChatSession:
    status = cast(SessionStatus, row.status)
    title = row._mapping.get("shown_title", row.title)
    return ChatSession(
        row.id, row.user_id, status, row.status_message, row.created_at, row.ttl, title
    )
