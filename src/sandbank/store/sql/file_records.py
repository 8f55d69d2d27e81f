"""File records and pending upload forms in SQL."""

from __future__ import annotations

import time
from typing import Any, cast

import sqlalchemy as sa

from sandbank.errors import SessionNotFound
from sandbank.store.records import FileRecord, Origin
from sandbank.store.schema import files, pending_uploads, quota_reservations, sessions
from sandbank.store.sql.chats import lock_chat, lock_user
from sandbank.store.sql.database import Conn, Database, every, one, scalar_int


class SqlFileRecords:
    """The `FileRecords` of a SQL database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def upsert(self, session_id: str, filename: str, size: int, origin: Origin) -> FileRecord:
        record = FileRecord(session_id, filename, size, origin, time.time())
        return await self.db.write(lambda conn: _put(conn, record))

    async def get(self, session_id: str, filename: str) -> FileRecord | None:
        row = await self.db.read(
            one(sa.select(files).where(*_is_file(files, session_id, filename)))
        )
        return None if row is None else _record(row)

    async def delete(self, session_id: str, filename: str) -> bool:
        def delete(conn: Conn) -> bool:
            lock_chat(conn, session_id)
            conn.execute(
                sa.delete(pending_uploads).where(*_is_file(pending_uploads, session_id, filename))
            )
            gone = sa.delete(files).where(*_is_file(files, session_id, filename))
            return bool(conn.execute(gone).rowcount)

        return await self.db.write(delete)

    async def of_session(self, session_id: str) -> list[FileRecord]:
        query = sa.select(files).where(files.c.session_id == session_id).order_by(files.c.filename)
        return [_record(r) for r in await self.db.read(every(query))]

    async def stored_bytes(self, user_id: str) -> int:
        return await self.db.read(scalar_int(_stored(user_id)))

    async def note_upload(self, session_id: str, filename: str, expires_at: float) -> None:
        where = _is_file(pending_uploads, session_id, filename)

        def note(conn: Conn) -> None:
            update = sa.update(pending_uploads).where(*where).values(expires_at=expires_at)
            if not conn.execute(update).rowcount:
                conn.execute(
                    sa.insert(pending_uploads).values(
                        session_id=session_id, filename=filename, expires_at=expires_at
                    )
                )

        await self.db.write(note, refused=lambda: SessionNotFound(f"no session {session_id}"))

    async def pending_uploads(self, session_id: str) -> dict[str, float]:
        query = sa.select(pending_uploads).where(pending_uploads.c.session_id == session_id)
        return {r.filename: r.expires_at for r in await self.db.read(every(query))}

    async def drop_upload(self, session_id: str, filename: str) -> None:
        drop = sa.delete(pending_uploads).where(*_is_file(pending_uploads, session_id, filename))
        await self.db.write(lambda conn: conn.execute(drop))

    async def reserve(
        self,
        reservation_id: str,
        session_id: str,
        filename: str,
        size: int,
        quota: int,
        expires_at: float,
    ) -> bool:
        res = quota_reservations

        def reserve(conn: Conn) -> bool:
            user_id = conn.execute(
                sa.select(sessions.c.user_id).where(sessions.c.id == session_id)
            ).scalar()
            if user_id is None:
                raise SessionNotFound(f"no session {session_id}")
            lock_user(conn, user_id)  # the user's counts hold until commit, on every replica
            now = time.time()
            conn.execute(sa.delete(res).where(res.c.user_id == user_id, res.c.expires_at < now))
            replaced = sa.and_(*_is_file(files, session_id, filename))
            stored = _stored(user_id).where(sa.not_(replaced))
            reserved = sa.select(sa.func.coalesce(sa.func.sum(res.c.size), 0)).where(
                res.c.user_id == user_id, res.c.id != reservation_id
            )
            used = int(conn.execute(stored).scalar() or 0) + int(
                conn.execute(reserved).scalar() or 0
            )
            if used + size > quota:
                return False  # the reservation of this id, if any, stays as it was
            conn.execute(sa.delete(res).where(res.c.id == reservation_id))
            conn.execute(
                sa.insert(res).values(
                    id=reservation_id,
                    user_id=user_id,
                    session_id=session_id,
                    filename=filename,
                    size=size,
                    expires_at=expires_at,
                )
            )
            return True

        return await self.db.write(reserve)

    async def release(self, reservation_id: str) -> None:
        drop = sa.delete(quota_reservations).where(quota_reservations.c.id == reservation_id)
        await self.db.write(lambda conn: conn.execute(drop))

    async def commit(
        self, reservation_id: str, session_id: str, filename: str, size: int, origin: Origin
    ) -> FileRecord:
        record = FileRecord(session_id, filename, size, origin, time.time())

        def commit(conn: Conn) -> FileRecord:
            _put(conn, record)
            res = quota_reservations
            conn.execute(sa.delete(res).where(res.c.id == reservation_id))
            return record

        return await self.db.write(commit)


def _is_file(table: sa.Table, session_id: str, filename: str) -> tuple[sa.ColumnElement[bool], ...]:
    """Where a row of `table` (files, pending uploads) is the chat's file `filename`."""
    return (table.c.session_id == session_id, table.c.filename == filename)


def _stored(user_id: str) -> sa.Select[Any]:
    """The size of the user's recorded files."""
    return (
        sa.select(sa.func.coalesce(sa.func.sum(files.c.size), 0))
        .join(sessions, sessions.c.id == files.c.session_id)
        .where(sessions.c.user_id == user_id)
    )


def _put(conn: Conn, record: FileRecord) -> FileRecord:
    """Write the file's record, created or replaced, its chat locked first: that serializes
    the writers of the chat's records (`SessionNotFound` without the chat)."""
    lock_chat(conn, record.session_id)
    values = {"size": record.size, "origin": record.origin, "updated_at": record.updated_at}
    where = _is_file(files, record.session_id, record.filename)
    if not conn.execute(sa.update(files).where(*where).values(**values)).rowcount:
        conn.execute(
            sa.insert(files).values(
                session_id=record.session_id, filename=record.filename, **values
            )
        )
    return record


def _record(row: sa.Row[Any]) -> FileRecord:
    origin = cast(Origin, row.origin)
    return FileRecord(row.session_id, row.filename, int(row.size), origin, row.updated_at)
