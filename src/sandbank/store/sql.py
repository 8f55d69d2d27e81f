"""The `Store` on SQLAlchemy: SQLite (one writer, pooled readers) or PostgreSQL (row locks)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar, cast

import anyio
import anyio.to_thread
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from sandbank.errors import Conflict, NotFound, SandbankError, SessionNotFound
from sandbank.store import sql_runs
from sandbank.store.base import (
    ACTIVE_RUN_STATES,
    ApiKey,
    CancelOutcome,
    ChatSession,
    FileRecord,
    LeaseLost,
    Message,
    Origin,
    ReleaseOutcome,
    Role,
    Run,
    RunState,
    SessionStatus,
    StartRefusal,
    User,
    hash_secret,
    new_key_id,
    new_secret,
)
from sandbank.store.engine import Engines, create_engines, migrate
from sandbank.store.schema import (
    api_keys,
    files,
    messages,
    pending_uploads,
    runs,
    sessions,
    users,
)
from sandbank.store.sql_runs import insert_message, lock_session, run_of

T = TypeVar("T")
Conn = sa.Connection


class SqlStore:
    """Each method is one transaction run in a worker thread; the event loop never blocks."""

    def __init__(self, engines: Engines) -> None:
        self._engines = engines
        # SQLite has one writer: queue writers here rather than in SQLite's busy loop.
        self._write_limiter = anyio.CapacityLimiter(1 if engines.is_sqlite else engines.pool_size)
        self._read_limiter = anyio.CapacityLimiter(engines.pool_size)

    @classmethod
    def open(cls, url: str) -> SqlStore:
        """Connect and migrate (blocking: call it from a thread at start-up)."""
        engines = create_engines(url)
        try:
            migrate(engines)
        except sa_exc.SQLAlchemyError as exc:
            engines.dispose()
            raise SandbankError(f"cannot open the database: {exc.__class__.__name__}") from exc
        return cls(engines)

    async def close(self) -> None:
        await anyio.to_thread.run_sync(self._engines.dispose)

    async def _write(self, fn: Callable[[Conn], T]) -> T:
        run = partial(_transact, self._engines.writer, fn)
        return await anyio.to_thread.run_sync(run, limiter=self._write_limiter)

    async def _read(self, fn: Callable[[Conn], T]) -> T:
        run = partial(_transact, self._engines.reader, fn)
        return await anyio.to_thread.run_sync(run, limiter=self._read_limiter)

    # --- users and API keys ----------------------------------------------------------------
    async def create_user(self, name: str) -> User:
        user = User(id=str(uuid.uuid4()), name=name, created_at=time.time())

        def run(conn: Conn) -> User:
            conn.execute(sa.insert(users).values(id=user.id, name=name, created_at=user.created_at))
            return user

        try:
            return await self._write(run)
        except _Integrity:
            raise Conflict(f"user {name!r} exists") from None

    async def get_user(self, name: str) -> User | None:
        row = await self._read(_one(sa.select(users).where(users.c.name == name)))
        return None if row is None else _user(row)

    async def get_user_by_id(self, user_id: str) -> User | None:
        row = await self._read(_one(sa.select(users).where(users.c.id == user_id)))
        return None if row is None else _user(row)

    async def delete_user(self, name: str) -> list[str]:
        def run(conn: Conn) -> list[str]:
            # Locking the user first orders us after (or before) any session being created
            # for them, so every session removed is one we report.
            user_id = conn.execute(
                sa.select(users.c.id).where(users.c.name == name).with_for_update()
            ).scalar()
            if user_id is None:
                raise NotFound(f"no user {name!r}")
            ids = conn.execute(
                sa.delete(sessions).where(sessions.c.user_id == user_id).returning(sessions.c.id)
            ).scalars()
            removed = list(ids)
            conn.execute(sa.delete(users).where(users.c.id == user_id))  # keys cascade
            return removed

        return await self._write(run)

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

        return await self._write(run), secret

    async def list_keys(self, user_name: str | None = None) -> list[ApiKey]:
        query = (
            sa.select(api_keys, users.c.name.label("user_name"))
            .join(users, users.c.id == api_keys.c.user_id)
            .order_by(api_keys.c.created_at)
        )
        if user_name is not None:
            query = query.where(users.c.name == user_name)
        rows = await self._read(_all(query))
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

        await self._write(run)

    async def authenticate(self, secret: str) -> User | None:
        query = (
            sa.select(users)
            .join(api_keys, api_keys.c.user_id == users.c.id)
            .where(api_keys.c.secret_hash == hash_secret(secret), api_keys.c.revoked_at.is_(None))
        )
        row = await self._read(_one(query))
        return None if row is None else _user(row)

    async def key_used(self, secret: str, at: float) -> None:
        last = api_keys.c.last_used_at
        update = (
            sa.update(api_keys)
            .where(api_keys.c.secret_hash == hash_secret(secret))
            .where(sa.or_(last.is_(None), last < at))  # replicas may write out of order
            .values(last_used_at=at)
        )
        await self._write(lambda conn: conn.execute(update))

    # --- sessions ----------------------------------------------------------------------------
    async def create_session(self, user_id: str, ttl_seconds: float) -> ChatSession:
        now = time.time()
        session = ChatSession(str(uuid.uuid4()), user_id, "DONE", None, now, now + ttl_seconds)

        def run(conn: Conn) -> ChatSession:
            conn.execute(
                sa.insert(sessions).values(
                    id=session.id,
                    user_id=user_id,
                    status=session.status,
                    status_message=None,
                    created_at=now,
                    ttl=session.ttl,
                )
            )
            return session

        try:
            return await self._write(run)
        except _Integrity:
            raise NotFound(f"no user with id {user_id!r}") from None

    async def get_session(self, session_id: str) -> ChatSession | None:
        row = await self._read(_one(sa.select(sessions).where(sessions.c.id == session_id)))
        return None if row is None else _session(row)

    async def list_sessions(self, user_id: str) -> list[ChatSession]:
        query = (
            sa.select(sessions)
            .where(sessions.c.user_id == user_id)
            .order_by(sessions.c.created_at.desc())
        )
        return [_session(r) for r in await self._read(_all(query))]

    async def delete_session(self, session_id: str) -> bool:
        def run(conn: Conn) -> bool:
            result = conn.execute(sa.delete(sessions).where(sessions.c.id == session_id))
            return bool(result.rowcount)

        return await self._write(run)

    async def try_start_run(self, session_id: str, status_message: str | None) -> bool:
        def run(conn: Conn) -> bool:
            # One conditional UPDATE: the database decides the winner of concurrent starts.
            result = conn.execute(
                sa.update(sessions)
                .where(sessions.c.id == session_id, sessions.c.status.in_(("DONE", "ERROR")))
                .values(status="PENDING", status_message=status_message)
            )
            if result.rowcount:
                return True
            lock_session(conn, session_id)  # raises SessionNotFound when missing
            return False

        return await self._write(run)

    async def set_status(
        self, session_id: str, status: SessionStatus, message: str | None = None
    ) -> None:
        def run(conn: Conn) -> None:
            result = conn.execute(
                sa.update(sessions)
                .where(sessions.c.id == session_id)
                .values(status=status, status_message=message)
            )
            if not result.rowcount:
                raise SessionNotFound(f"no session {session_id}")

        await self._write(run)

    async def fail_orphan_pending(self, message: str) -> list[str]:
        def run(conn: Conn) -> list[str]:
            has_run = (
                sa.select(runs.c.id)
                .where(runs.c.session_id == sessions.c.id, runs.c.state.in_(ACTIVE_RUN_STATES))
                .exists()
            )
            ids = conn.execute(
                sa.update(sessions)
                .where(sessions.c.status == "PENDING", ~has_run)
                .values(status="ERROR", status_message=message)
                .returning(sessions.c.id)
            ).scalars()
            return list(ids)

        return await self._write(run)

    async def expired_sessions(self, now: float) -> list[str]:
        query = sa.select(sessions.c.id).where(sessions.c.ttl <= now).order_by(sessions.c.ttl)
        return [r.id for r in await self._read(_all(query))]

    async def count_sessions(self, user_id: str) -> int:
        query = sa.select(sa.func.count()).where(sessions.c.user_id == user_id)
        return await self._read(_scalar_int(query))

    async def count_pending(self, user_id: str | None = None) -> int:
        query = sa.select(sa.func.count()).where(sessions.c.status == "PENDING")
        if user_id is not None:
            query = query.where(sessions.c.user_id == user_id)
        return await self._read(_scalar_int(query))

    # --- runs: leased jobs (transactions in sql_runs) -----------------------------------------
    async def start_run(
        self,
        session_id: str,
        content: str,
        *,
        max_per_user: int,
        max_total: int,
        owner: str | None,
        lease_seconds: float,
        affinity: bool = False,
    ) -> tuple[Message, Run] | StartRefusal:
        start = partial(
            sql_runs.start_run,
            session_id=session_id,
            content=content,
            max_per_user=max_per_user,
            max_total=max_total,
            owner=owner,
            lease_seconds=lease_seconds,
            affinity=affinity,
            is_sqlite=self._engines.is_sqlite,
        )
        return await self._write(start)

    async def claim_runs(
        self, owner: str, limit: int, lease_seconds: float, affinity_seconds: float = 0.0
    ) -> list[Run]:
        if limit <= 0:
            return []
        claim = partial(
            sql_runs.claim_runs,
            owner=owner,
            limit=limit,
            lease_seconds=lease_seconds,
            affinity_seconds=affinity_seconds,
        )
        return await self._write(claim)

    async def renew_runs(
        self, owner: str, run_ids: list[str], lease_seconds: float
    ) -> dict[str, bool]:
        if not run_ids:
            return {}
        renew = partial(
            sql_runs.renew_runs, owner=owner, run_ids=run_ids, lease_seconds=lease_seconds
        )
        return await self._write(renew)

    async def finish_run(
        self, run: Run, status: SessionStatus, message: str | None, state: RunState
    ) -> bool:
        finish = partial(sql_runs.finish_run, run=run, status=status, message=message, state=state)
        return await self._write(finish)

    async def release_run(self, run: Run, status_message: str | None) -> ReleaseOutcome:
        release = partial(sql_runs.release_run, run=run, status_message=status_message)
        return await self._write(release)

    async def request_cancel(self, session_id: str) -> CancelOutcome:
        return await self._write(partial(sql_runs.request_cancel, session_id=session_id))

    async def note_sandbox(self, session_id: str, replica: str, sandbox_id: str) -> None:
        def do(conn: Conn) -> None:
            conn.execute(
                sa.update(sessions)
                .where(sessions.c.id == session_id)
                .values(replica=replica, sandbox_id=sandbox_id)
            )

        await self._write(do)

    async def session_sandbox(self, session_id: str) -> tuple[str | None, str | None]:
        query = sa.select(sessions.c.replica, sessions.c.sandbox_id).where(
            sessions.c.id == session_id
        )
        row = await self._read(_one(query))
        return (None, None) if row is None else (row.replica, row.sandbox_id)

    async def get_run(self, run_id: str) -> Run | None:
        row = await self._read(_one(sa.select(runs).where(runs.c.id == run_id)))
        return None if row is None else run_of(row)

    async def active_run(self, session_id: str) -> Run | None:
        query = sa.select(runs).where(
            runs.c.session_id == session_id, runs.c.state.in_(ACTIVE_RUN_STATES)
        )
        row = await self._read(_one(query))
        return None if row is None else run_of(row)

    async def expire_leases(self) -> int:
        return await self._write(sql_runs.expire_leases)

    async def set_progress(self, run: Run, message: str) -> None:
        await self._write(partial(sql_runs.set_progress, run=run, message=message))

    # --- messages ----------------------------------------------------------------------------
    async def add_message(
        self,
        session_id: str,
        role: Role,
        content: str,
        internal: bool = False,
        fence: Run | None = None,
    ) -> Message:
        def run(conn: Conn) -> Message:
            # The session row lock (PostgreSQL) or the write lock (SQLite) is held until
            # commit, so timestamps are assigned and become visible in the same order: a
            # reader polling with the last timestamp it saw cannot miss a message.
            last = lock_session(conn, session_id)
            if fence is not None:
                # A shared lock on the run: a takeover waits for (or skips) this commit.
                held = conn.execute(
                    sa.select(runs.c.id)
                    .where(
                        runs.c.id == fence.id,
                        runs.c.owner == fence.owner,
                        runs.c.state == "running",
                    )
                    .with_for_update(read=True)
                ).first()
                if held is None:
                    raise LeaseLost(f"run {fence.id} is no longer held by {fence.owner}")
            return insert_message(conn, session_id, last, role, content, internal)

        return await self._write(run)

    async def list_messages(self, session_id: str, after: float | None = None) -> list[Message]:
        query = sa.select(messages).where(messages.c.session_id == session_id)
        if after is not None:
            query = query.where(messages.c.timestamp > after)
        rows = await self._read(_all(query.order_by(messages.c.timestamp)))
        return [
            Message(r.session_id, r.timestamp, cast(Role, r.role), r.content, bool(r.internal))
            for r in rows
        ]

    # --- file records ------------------------------------------------------------------------
    async def upsert_file(
        self, session_id: str, filename: str, size: int, origin: Origin
    ) -> FileRecord:
        record = FileRecord(session_id, filename, size, origin, time.time())
        values = {"size": size, "origin": origin, "updated_at": record.updated_at}

        def run(conn: Conn) -> FileRecord:
            lock_session(conn, session_id)  # serializes writers of this session's records
            where = (files.c.session_id == session_id, files.c.filename == filename)
            if not conn.execute(sa.update(files).where(*where).values(**values)).rowcount:
                conn.execute(
                    sa.insert(files).values(session_id=session_id, filename=filename, **values)
                )
            return record

        return await self._write(run)

    async def list_files(self, session_id: str) -> list[FileRecord]:
        query = sa.select(files).where(files.c.session_id == session_id).order_by(files.c.filename)
        return [_file(r) for r in await self._read(_all(query))]

    async def get_file(self, session_id: str, filename: str) -> FileRecord | None:
        query = sa.select(files).where(
            files.c.session_id == session_id, files.c.filename == filename
        )
        row = await self._read(_one(query))
        return None if row is None else _file(row)

    async def delete_file(self, session_id: str, filename: str) -> bool:
        def run(conn: Conn) -> bool:
            where = (files.c.session_id == session_id, files.c.filename == filename)
            return bool(conn.execute(sa.delete(files).where(*where)).rowcount)

        return await self._write(run)

    async def user_stored_bytes(self, user_id: str) -> int:
        query = (
            sa.select(sa.func.coalesce(sa.func.sum(files.c.size), 0))
            .join(sessions, sessions.c.id == files.c.session_id)
            .where(sessions.c.user_id == user_id)
        )
        return await self._read(_scalar_int(query))

    # --- upload forms awaiting their object (S3) ---------------------------------------------
    async def note_upload(self, session_id: str, filename: str, expires_at: float) -> None:
        def run(conn: Conn) -> None:
            where = (
                pending_uploads.c.session_id == session_id,
                pending_uploads.c.filename == filename,
            )
            updated = conn.execute(
                sa.update(pending_uploads).where(*where).values(expires_at=expires_at)
            ).rowcount
            if not updated:
                conn.execute(
                    sa.insert(pending_uploads).values(
                        session_id=session_id, filename=filename, expires_at=expires_at
                    )
                )

        try:
            await self._write(run)
        except _Integrity:
            raise SessionNotFound(f"no session {session_id}") from None

    async def pending_uploads(self, session_id: str) -> dict[str, float]:
        query = sa.select(pending_uploads).where(pending_uploads.c.session_id == session_id)
        return {r.filename: r.expires_at for r in await self._read(_all(query))}

    async def drop_upload(self, session_id: str, filename: str) -> None:
        def run(conn: Conn) -> None:
            conn.execute(
                sa.delete(pending_uploads).where(
                    pending_uploads.c.session_id == session_id,
                    pending_uploads.c.filename == filename,
                )
            )

        await self._write(run)


class _Integrity(SandbankError):
    """A constraint refused a write; the calling method says which error that means."""


def _transact(engine: sa.Engine, fn: Callable[[Conn], T]) -> T:
    try:
        with engine.begin() as conn:
            return fn(conn)
    except sa_exc.IntegrityError as exc:
        raise _Integrity("constraint violated") from exc
    except sa_exc.SQLAlchemyError as exc:
        # Translated at the edge; the cause stays chained for the log, never sent to clients.
        raise SandbankError(f"database error: {exc.__class__.__name__}") from exc


def _one(query: sa.Select[Any]) -> Callable[[Conn], sa.Row[Any] | None]:
    return lambda conn: conn.execute(query).first()


def _all(query: sa.Select[Any]) -> Callable[[Conn], list[sa.Row[Any]]]:
    return lambda conn: list(conn.execute(query).all())


def _scalar_int(query: sa.Select[Any]) -> Callable[[Conn], int]:
    return lambda conn: int(conn.execute(query).scalar() or 0)


def _user(row: sa.Row[Any]) -> User:
    return User(row.id, row.name, row.created_at)


def _session(row: sa.Row[Any]) -> ChatSession:
    status = cast(SessionStatus, row.status)
    return ChatSession(row.id, row.user_id, status, row.status_message, row.created_at, row.ttl)


def _file(row: sa.Row[Any]) -> FileRecord:
    origin = cast(Origin, row.origin)
    return FileRecord(row.session_id, row.filename, int(row.size), origin, row.updated_at)
