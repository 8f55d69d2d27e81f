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
        values = {"size": size, "origin": origin, "updated_at": record.updated_at}

        def upsert(conn: Conn) -> FileRecord:
            lock_chat(conn, session_id)  # serializes writers of this chat's records
            where = (files.c.session_id == session_id, files.c.filename == filename)
            if not conn.execute(sa.update(files).where(*where).values(**values)).rowcount:
                conn.execute(
                    sa.insert(files).values(session_id=session_id, filename=filename, **values)
                )
            return record

        return await self.db.write(upsert)

    async def get(self, session_id: str, filename: str) -> FileRecord | None:
        query = sa.select(files).where(
            files.c.session_id == session_id, files.c.filename == filename
        )
        row = await self.db.read(one(query))
        return None if row is None else _record(row)

    async def delete(self, session_id: str, filename: str) -> bool:
        def delete(conn: Conn) -> bool:
            lock_chat(conn, session_id)
            conn.execute(
                sa.delete(pending_uploads).where(
                    pending_uploads.c.session_id == session_id,
                    pending_uploads.c.filename == filename,
                )
            )
            gone = sa.delete(files).where(
                files.c.session_id == session_id, files.c.filename == filename
            )
            return bool(conn.execute(gone).rowcount)

        return await self.db.write(delete)

    async def of_session(self, session_id: str) -> list[FileRecord]:
        query = sa.select(files).where(files.c.session_id == session_id).order_by(files.c.filename)
        return [_record(r) for r in await self.db.read(every(query))]

    async def stored_bytes(self, user_id: str) -> int:
        query = (
            sa.select(sa.func.coalesce(sa.func.sum(files.c.size), 0))
            .join(sessions, sessions.c.id == files.c.session_id)
            .where(sessions.c.user_id == user_id)
        )
        return await self.db.read(scalar_int(query))

    async def note_upload(self, session_id: str, filename: str, expires_at: float) -> None:
        where = (pending_uploads.c.session_id == session_id, pending_uploads.c.filename == filename)

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
        drop = sa.delete(pending_uploads).where(
            pending_uploads.c.session_id == session_id, pending_uploads.c.filename == filename
        )
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
            stored = (
                sa.select(sa.func.coalesce(sa.func.sum(files.c.size), 0))
                .join(sessions, sessions.c.id == files.c.session_id)
                .where(sessions.c.user_id == user_id)
                .where(
                    sa.not_(sa.and_(files.c.session_id == session_id, files.c.filename == filename))
                )
            )
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
        values = {"size": size, "origin": origin, "updated_at": record.updated_at}

        def commit(conn: Conn) -> FileRecord:
            lock_chat(conn, session_id)
            where = (files.c.session_id == session_id, files.c.filename == filename)
            if not conn.execute(sa.update(files).where(*where).values(**values)).rowcount:
                conn.execute(
                    sa.insert(files).values(session_id=session_id, filename=filename, **values)
                )
            res = quota_reservations
            conn.execute(sa.delete(res).where(res.c.id == reservation_id))
            return record

        return await self.db.write(commit)


def _record(row: sa.Row[Any]) -> FileRecord:
    origin = cast(Origin, row.origin)
    return FileRecord(row.session_id, row.filename, int(row.size), origin, row.updated_at)
