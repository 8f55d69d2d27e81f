"""The run queue in SQL: start (limits counted under a lock), claim (`FOR UPDATE SKIP
LOCKED`), renew, fenced writes, finish, hand back, cancel; each one transaction that changes
the run and its chat together."""

from __future__ import annotations

import time
from dataclasses import asdict
from functools import partial
from typing import Any, Unpack, cast

import sqlalchemy as sa

from sandbank.errors import LeaseLost, SessionNotFound
from sandbank.store.records import (
    ACTIVE_RUN_STATES,
    CANCELLED,
    CancelOutcome,
    Message,
    ReleaseOutcome,
    Role,
    Run,
    RunState,
    SessionStatus,
    StartRefusal,
    StartTerms,
    posted_run,
    start_refusal,
    unattended,
)
from sandbank.store.schema import messages, runs, sessions
from sandbank.store.sql.chats import insert_message, lock_chat, set_status
from sandbank.store.sql.database import Conn, Database

# Any constant will do: every replica takes it while deciding whether a question may start,
# so the per-user and total run limits hold for the whole fleet.
RUN_START_LOCK_ID = 0x5A4D_B4E5


class SqlRunQueue:
    """The `RunQueue` of a SQL database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def start(
        self, session_id: str, content: str | None, **terms: Unpack[StartTerms]
    ) -> tuple[Message, Run] | StartRefusal:
        def start(conn: Conn) -> tuple[Message, Run] | StartRefusal:
            if not self.db.is_sqlite:
                # Counting then starting must not interleave with another replica's start.
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(RUN_START_LOCK_ID)))
            last = lock_chat(conn, session_id)
            chat = conn.execute(
                sa.select(sessions.c.user_id, sessions.c.status, sessions.c.replica).where(
                    sessions.c.id == session_id
                )
            ).one()
            pending = partial(_count_pending, conn)
            refusal = start_refusal(chat.status, chat.user_id, pending, terms)
            if refusal is not None:
                return refusal
            if content is None:
                row = conn.execute(
                    sa.select(messages.c.timestamp, messages.c.content)
                    .where(messages.c.session_id == session_id, messages.c.role == "user")
                    .order_by(messages.c.timestamp.desc())
                    .limit(1)
                ).first()
                if row is None:
                    return "no_question"
                question = Message(session_id, row.timestamp, "user", row.content, False)
            else:
                question = insert_message(conn, session_id, last, "user", content, False)
            set_status(conn, session_id, "PENDING", "starting")
            run = posted_run(question, chat.user_id, terms, sandbox_replica=chat.replica)
            conn.execute(sa.insert(runs).values(**asdict(run), updated_at=run.created_at))
            return question, run

        return await self.db.write(start)

    async def claim(
        self, owner: str, limit: int, lease_seconds: float, affinity_seconds: float = 0.0
    ) -> list[Run]:
        if limit <= 0:
            return []

        def claim(conn: Conn) -> list[Run]:
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

        return await self.db.write(claim)

    async def renew(self, owner: str, run_ids: list[str], lease_seconds: float) -> dict[str, bool]:
        if not run_ids:
            return {}

        def renew(conn: Conn) -> dict[str, bool]:
            now = time.time()
            rows = conn.execute(
                sa.update(runs)
                .where(runs.c.id.in_(run_ids), runs.c.owner == owner, runs.c.state == "running")
                .values(lease_until=now + lease_seconds, updated_at=now)
                .returning(runs.c.id, runs.c.cancel_requested)
            ).all()
            return {r.id: bool(r.cancel_requested) for r in rows}

        return await self.db.write(renew)

    async def add_message(self, run: Run, role: Role, content: str, internal: bool) -> Message:
        def add(conn: Conn) -> Message:
            last = lock_chat(conn, run.session_id)
            # A shared lock on the run: a takeover waits for (or skips) this commit.
            held = conn.execute(
                sa.select(runs.c.id).where(*_holds(run)).with_for_update(read=True)
            ).first()
            if held is None:
                raise LeaseLost(f"run {run.id} is no longer held by {run.owner}")
            return insert_message(conn, run.session_id, last, role, content, internal)

        return await self.db.write(add)

    async def set_progress(self, run: Run, message: str) -> None:
        def progress(conn: Conn) -> None:
            held = sa.select(runs.c.id).where(*_holds(run)).exists()
            result = conn.execute(
                sa.update(sessions)
                .where(sessions.c.id == run.session_id, held)
                .values(status_message=message)
            )
            if not result.rowcount:
                raise LeaseLost(f"run {run.id} is no longer held by {run.owner}")

        await self.db.write(progress)

    async def finish(
        self, run: Run, status: SessionStatus, message: str | None, state: RunState
    ) -> bool:
        def finish(conn: Conn) -> bool:
            try:
                lock_chat(conn, run.session_id)
            except SessionNotFound:
                return False
            ended = _end(conn, run, state=state, lease_until=None, message=message)
            if ended:
                set_status(conn, run.session_id, status, message)
            return ended

        return await self.db.write(finish)

    async def release(self, run: Run, status_message: str | None) -> ReleaseOutcome:
        def release(conn: Conn) -> ReleaseOutcome:
            try:
                lock_chat(conn, run.session_id)
            except SessionNotFound:
                return "lost"
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
                ended = _end(conn, run, state="done", lease_until=None)
                if ended:
                    set_status(conn, run.session_id, "DONE", None)
                return "answered" if ended else "lost"
            if not _end(conn, run, state="queued", owner=None, lease_until=None):
                return "lost"
            conn.execute(
                sa.update(sessions)
                .where(sessions.c.id == run.session_id)
                .values(status_message=status_message)
            )
            return "released"

        return await self.db.write(release)

    async def request_cancel(self, session_id: str) -> CancelOutcome:
        def cancel(conn: Conn) -> CancelOutcome:
            lock_chat(conn, session_id)
            row = conn.execute(
                sa.select(runs)
                .where(runs.c.session_id == session_id, runs.c.state.in_(ACTIVE_RUN_STATES))
                .with_for_update()
            ).first()
            if row is None:
                return "none"
            now = time.time()
            this = sa.update(runs).where(runs.c.id == row.id)
            if unattended(_run(row), now):
                # Nobody works on it: end it here rather than wait for a claimer.
                conn.execute(
                    this.values(
                        state="cancelled",
                        cancel_requested=True,
                        lease_until=None,
                        message=CANCELLED,
                        updated_at=now,
                    )
                )
                set_status(conn, session_id, "ERROR", CANCELLED)
                return "ended"
            conn.execute(this.values(cancel_requested=True, updated_at=now))
            return "requested"

        return await self.db.write(cancel)

    async def expire_leases(self) -> int:
        expire = sa.update(runs).where(runs.c.state == "running").values(lease_until=0.0)
        return await self.db.write(lambda conn: int(conn.execute(expire).rowcount))

    async def fail_orphan_pending(self, message: str) -> list[str]:
        has_run = (
            sa.select(runs.c.id)
            .where(runs.c.session_id == sessions.c.id, runs.c.state.in_(ACTIVE_RUN_STATES))
            .exists()
        )
        fail = (
            sa.update(sessions)
            .where(sessions.c.status == "PENDING", ~has_run)
            .values(status="ERROR", status_message=message)
            .returning(sessions.c.id)
        )
        return await self.db.write(lambda conn: list(conn.execute(fail).scalars()))


def _count_pending(conn: Conn, user_id: str | None) -> int:
    """The user's PENDING chats; everyone's when `user_id` is None."""
    query = sa.select(sa.func.count()).where(sessions.c.status == "PENDING")
    if user_id is not None:
        query = query.where(sessions.c.user_id == user_id)
    return int(conn.execute(query).scalar() or 0)


def _holds(run: Run) -> tuple[Any, ...]:
    """Where `run.owner` still holds the run."""
    return (runs.c.id == run.id, runs.c.owner == run.owner, runs.c.state == "running")


def _end(conn: Conn, run: Run, **values: Any) -> bool:
    """Change the run while its owner still holds it; whether it did."""
    update = sa.update(runs).where(*_holds(run)).values(**values, updated_at=time.time())
    return bool(conn.execute(update).rowcount)


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
