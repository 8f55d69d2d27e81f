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
from sandbank.store.base import (
    ACTIVE_RUN_STATES,
    ApiKey,
    CancelOutcome,
    FileRecord,
    LeaseLost,
    Message,
    Origin,
    ReleaseOutcome,
    Role,
    Run,
    RunState,
    Session,
    SessionStatus,
    StartRefusal,
    User,
    hash_secret,
    new_key_id,
    new_secret,
    next_timestamp,
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

T = TypeVar("T")
Conn = sa.Connection
# Any constant will do: every replica takes it while deciding whether a question may start,
# so the per-user and total run limits hold for the whole fleet.
RUN_START_LOCK_ID = 0x5A4D_B4E5
CANCELLED = "cancelled"


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
        return [ApiKey(r.id, r.user_id, r.user_name, r.created_at, r.revoked_at) for r in rows]

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

    # --- sessions ----------------------------------------------------------------------------
    async def create_session(self, user_id: str, ttl_seconds: float) -> Session:
        now = time.time()
        session = Session(str(uuid.uuid4()), user_id, "DONE", None, now, now + ttl_seconds)

        def run(conn: Conn) -> Session:
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

    async def get_session(self, session_id: str) -> Session | None:
        row = await self._read(_one(sa.select(sessions).where(sessions.c.id == session_id)))
        return None if row is None else _session(row)

    async def list_sessions(self, user_id: str) -> list[Session]:
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
            _lock_session(conn, session_id)  # raises SessionNotFound when missing
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

    # --- runs: leased jobs ------------------------------------------------------------------
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
        def run(conn: Conn) -> tuple[Message, Run] | StartRefusal:
            if not self._engines.is_sqlite:
                # Counting then starting must not interleave with another replica's start.
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(RUN_START_LOCK_ID)))
            last = _lock_session(conn, session_id)
            row = conn.execute(
                sa.select(sessions.c.user_id, sessions.c.status, sessions.c.replica).where(
                    sessions.c.id == session_id
                )
            ).one()
            if row.status == "PENDING":
                return "busy"
            pending = sa.select(sa.func.count()).where(sessions.c.status == "PENDING")
            mine = pending.where(sessions.c.user_id == row.user_id)
            if int(conn.execute(mine).scalar() or 0) >= max_per_user:
                return "user_limit"
            if int(conn.execute(pending).scalar() or 0) >= max_total:
                return "total_limit"
            conn.execute(
                sa.update(sessions)
                .where(sessions.c.id == session_id)
                .values(status="PENDING", status_message="starting")
            )
            question = _insert_message(conn, session_id, last, "user", content, False)
            now = time.time()
            preferred = row.replica if affinity and row.replica != owner else None
            # A session whose sandbox is elsewhere is left, for a moment, to that replica.
            holder = owner if preferred is None else None
            started = Run(
                id=str(uuid.uuid4()),
                session_id=session_id,
                user_id=row.user_id,
                question_at=question.timestamp,
                state="queued" if holder is None else "running",
                owner=holder,
                lease_until=None if holder is None else now + lease_seconds,
                cancel_requested=False,
                attempts=0 if holder is None else 1,
                created_at=now,
                preferred=preferred,
            )
            conn.execute(
                sa.insert(runs).values(
                    preferred=preferred,
                    id=started.id,
                    session_id=session_id,
                    user_id=started.user_id,
                    question_at=started.question_at,
                    state=started.state,
                    owner=holder,
                    lease_until=started.lease_until,
                    cancel_requested=False,
                    attempts=started.attempts,
                    created_at=now,
                    updated_at=now,
                )
            )
            return question, started

        return await self._write(run)

    async def claim_runs(
        self, owner: str, limit: int, lease_seconds: float, affinity_seconds: float = 0.0
    ) -> list[Run]:
        def run(conn: Conn) -> list[Run]:
            now = time.time()
            mine_to_take = sa.or_(
                runs.c.preferred.is_(None),
                runs.c.preferred == owner,
                runs.c.created_at <= now - affinity_seconds,
            )
            claimable = (
                sa.select(runs.c.id)
                .where(
                    sa.or_(
                        sa.and_(runs.c.state == "queued", mine_to_take),
                        sa.and_(runs.c.state == "running", runs.c.lease_until < now),
                    )
                )
                .order_by(runs.c.created_at)
                .limit(limit)
                # Rows another claimer is taking are skipped, never waited for nor shared.
                .with_for_update(skip_locked=True)
            )
            ids = list(conn.execute(claimable).scalars())
            if not ids:
                return []
            rows = conn.execute(
                sa.update(runs)
                .where(runs.c.id.in_(ids))
                .values(
                    state="running",
                    owner=owner,
                    lease_until=now + lease_seconds,
                    attempts=runs.c.attempts + 1,
                    updated_at=now,
                )
                .returning(*runs.c)
            ).all()
            return sorted((_run(r) for r in rows), key=lambda r: r.created_at)

        if limit <= 0:
            return []
        return await self._write(run)

    async def renew_runs(
        self, owner: str, run_ids: list[str], lease_seconds: float
    ) -> dict[str, bool]:
        def run(conn: Conn) -> dict[str, bool]:
            now = time.time()
            rows = conn.execute(
                sa.update(runs)
                .where(runs.c.id.in_(run_ids), runs.c.owner == owner, runs.c.state == "running")
                .values(lease_until=now + lease_seconds, updated_at=now)
                .returning(runs.c.id, runs.c.cancel_requested)
            ).all()
            return {r.id: bool(r.cancel_requested) for r in rows}

        if not run_ids:
            return {}
        return await self._write(run)

    async def finish_run(
        self, run: Run, status: SessionStatus, message: str | None, state: RunState
    ) -> bool:
        def do(conn: Conn) -> bool:
            try:
                _lock_session(conn, run.session_id)
            except SessionNotFound:
                return False
            ended = conn.execute(
                _held(run).values(
                    state=state, lease_until=None, message=message, updated_at=time.time()
                )
            ).rowcount
            if ended:
                conn.execute(
                    sa.update(sessions)
                    .where(sessions.c.id == run.session_id)
                    .values(status=status, status_message=message)
                )
            return bool(ended)

        return await self._write(do)

    async def release_run(self, run: Run, status_message: str | None) -> ReleaseOutcome:
        def do(conn: Conn) -> ReleaseOutcome:
            try:
                _lock_session(conn, run.session_id)
            except SessionNotFound:
                return "lost"
            now = time.time()
            answer = conn.execute(
                sa.select(messages.c.id)
                .where(
                    messages.c.session_id == run.session_id,
                    messages.c.timestamp > run.question_at,
                    messages.c.role == "assistant",
                    messages.c.internal.is_(False),
                )
                .limit(1)
            ).first()
            if answer is not None:
                ended = conn.execute(
                    _held(run).values(state="done", lease_until=None, updated_at=now)
                ).rowcount
                if ended:
                    conn.execute(
                        sa.update(sessions)
                        .where(sessions.c.id == run.session_id)
                        .values(status="DONE", status_message=None)
                    )
                return "answered" if ended else "lost"
            released = conn.execute(
                _held(run).values(state="queued", owner=None, lease_until=None, updated_at=now)
            ).rowcount
            if not released:
                return "lost"
            conn.execute(
                sa.update(sessions)
                .where(sessions.c.id == run.session_id)
                .values(status_message=status_message)
            )
            return "released"

        return await self._write(do)

    async def request_cancel(self, session_id: str) -> CancelOutcome:
        def do(conn: Conn) -> CancelOutcome:
            _lock_session(conn, session_id)
            row = conn.execute(
                sa.select(runs)
                .where(runs.c.session_id == session_id, runs.c.state.in_(ACTIVE_RUN_STATES))
                .with_for_update()
            ).first()
            if row is None:
                return "none"
            now = time.time()
            if row.state == "queued" or (row.lease_until or 0) < now:
                # Nobody works on it: end it here rather than wait for a claimer.
                conn.execute(
                    sa.update(runs)
                    .where(runs.c.id == row.id)
                    .values(
                        state="cancelled",
                        cancel_requested=True,
                        lease_until=None,
                        message=CANCELLED,
                        updated_at=now,
                    )
                )
                conn.execute(
                    sa.update(sessions)
                    .where(sessions.c.id == session_id)
                    .values(status="ERROR", status_message=CANCELLED)
                )
                return "ended"
            conn.execute(
                sa.update(runs)
                .where(runs.c.id == row.id)
                .values(cancel_requested=True, updated_at=now)
            )
            return "requested"

        return await self._write(do)

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
        return None if row is None else _run(row)

    async def active_run(self, session_id: str) -> Run | None:
        query = sa.select(runs).where(
            runs.c.session_id == session_id, runs.c.state.in_(ACTIVE_RUN_STATES)
        )
        row = await self._read(_one(query))
        return None if row is None else _run(row)

    async def expire_leases(self) -> int:
        def do(conn: Conn) -> int:
            result = conn.execute(
                sa.update(runs).where(runs.c.state == "running").values(lease_until=0.0)
            )
            return int(result.rowcount)

        return await self._write(do)

    async def set_progress(self, run: Run, message: str) -> None:
        def do(conn: Conn) -> None:
            held = (
                sa.select(runs.c.id)
                .where(runs.c.id == run.id, runs.c.owner == run.owner, runs.c.state == "running")
                .exists()
            )
            result = conn.execute(
                sa.update(sessions)
                .where(sessions.c.id == run.session_id, held)
                .values(status_message=message)
            )
            if not result.rowcount:
                raise LeaseLost(f"run {run.id} is no longer held by {run.owner}")

        await self._write(do)

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
            last = _lock_session(conn, session_id)
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
            return _insert_message(conn, session_id, last, role, content, internal)

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
            _lock_session(conn, session_id)  # serializes writers of this session's records
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


def _insert_message(
    conn: Conn, session_id: str, last: float | None, role: Role, content: str, internal: bool
) -> Message:
    """Append a message to a session whose row the caller locked (its latest stamp: `last`)."""
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


def _held(run: Run) -> sa.Update:
    """An UPDATE of `run` that matches only while its owner still holds it."""
    return sa.update(runs).where(
        runs.c.id == run.id, runs.c.owner == run.owner, runs.c.state == "running"
    )


def _lock_session(conn: Conn, session_id: str) -> float | None:
    row = conn.execute(
        sa.select(sessions.c.last_message_at)
        .where(sessions.c.id == session_id)
        .with_for_update()  # ignored by SQLite, whose writer already holds the database lock
    ).first()
    if row is None:
        raise SessionNotFound(f"no session {session_id}")
    return cast(float | None, row.last_message_at)


def _one(query: sa.Select[Any]) -> Callable[[Conn], sa.Row[Any] | None]:
    return lambda conn: conn.execute(query).first()


def _all(query: sa.Select[Any]) -> Callable[[Conn], list[sa.Row[Any]]]:
    return lambda conn: list(conn.execute(query).all())


def _scalar_int(query: sa.Select[Any]) -> Callable[[Conn], int]:
    return lambda conn: int(conn.execute(query).scalar() or 0)


def _user(row: sa.Row[Any]) -> User:
    return User(row.id, row.name, row.created_at)


def _session(row: sa.Row[Any]) -> Session:
    status = cast(SessionStatus, row.status)
    return Session(row.id, row.user_id, status, row.status_message, row.created_at, row.ttl)


def _run(row: sa.Row[Any]) -> Run:
    return Run(
        id=row.id,
        session_id=row.session_id,
        user_id=row.user_id,
        question_at=row.question_at,
        state=cast(RunState, row.state),
        owner=row.owner,
        lease_until=row.lease_until,
        cancel_requested=bool(row.cancel_requested),
        attempts=int(row.attempts),
        created_at=row.created_at,
        message=row.message,
        preferred=row.preferred,
    )


def _file(row: sa.Row[Any]) -> FileRecord:
    origin = cast(Origin, row.origin)
    return FileRecord(row.session_id, row.filename, int(row.size), origin, row.updated_at)
