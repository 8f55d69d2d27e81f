"""The transactions of runs as leased jobs, each a function of one connection: start (limits
counted under a lock), claim (`FOR UPDATE SKIP LOCKED`), renew, finish, hand back, cancel."""

from __future__ import annotations

import time
import uuid
from typing import Any, cast

import sqlalchemy as sa

from sandbank.errors import SessionNotFound
from sandbank.store.base import (
    ACTIVE_RUN_STATES,
    CancelOutcome,
    LeaseLost,
    Message,
    ReleaseOutcome,
    Role,
    Run,
    RunState,
    SessionStatus,
    StartRefusal,
    next_timestamp,
)
from sandbank.store.schema import messages, runs, sessions

Conn = sa.Connection
# Any constant will do: every replica takes it while deciding whether a question may start,
# so the per-user and total run limits hold for the whole fleet.
RUN_START_LOCK_ID = 0x5A4D_B4E5
CANCELLED = "cancelled"


def start_run(
    conn: Conn,
    session_id: str,
    content: str,
    *,
    max_per_user: int,
    max_total: int,
    owner: str | None,
    lease_seconds: float,
    affinity: bool,
    is_sqlite: bool,
) -> tuple[Message, Run] | StartRefusal:
    if not is_sqlite:
        # Counting then starting must not interleave with another replica's start.
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(RUN_START_LOCK_ID)))
    last = lock_session(conn, session_id)
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
    question = insert_message(conn, session_id, last, "user", content, False)
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


def claim_runs(
    conn: Conn, owner: str, limit: int, lease_seconds: float, affinity_seconds: float
) -> list[Run]:
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
    return sorted((run_of(r) for r in rows), key=lambda r: r.created_at)


def renew_runs(conn: Conn, owner: str, run_ids: list[str], lease_seconds: float) -> dict[str, bool]:
    now = time.time()
    rows = conn.execute(
        sa.update(runs)
        .where(runs.c.id.in_(run_ids), runs.c.owner == owner, runs.c.state == "running")
        .values(lease_until=now + lease_seconds, updated_at=now)
        .returning(runs.c.id, runs.c.cancel_requested)
    ).all()
    return {r.id: bool(r.cancel_requested) for r in rows}


def finish_run(
    conn: Conn, run: Run, status: SessionStatus, message: str | None, state: RunState
) -> bool:
    try:
        lock_session(conn, run.session_id)
    except SessionNotFound:
        return False
    ended = conn.execute(
        _held(run).values(state=state, lease_until=None, message=message, updated_at=time.time())
    ).rowcount
    if ended:
        conn.execute(
            sa.update(sessions)
            .where(sessions.c.id == run.session_id)
            .values(status=status, status_message=message)
        )
    return bool(ended)


def release_run(conn: Conn, run: Run, status_message: str | None) -> ReleaseOutcome:
    try:
        lock_session(conn, run.session_id)
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


def request_cancel(conn: Conn, session_id: str) -> CancelOutcome:
    lock_session(conn, session_id)
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
        sa.update(runs).where(runs.c.id == row.id).values(cancel_requested=True, updated_at=now)
    )
    return "requested"


def expire_leases(conn: Conn) -> int:
    result = conn.execute(sa.update(runs).where(runs.c.state == "running").values(lease_until=0.0))
    return int(result.rowcount)


def set_progress(conn: Conn, run: Run, message: str) -> None:
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


def insert_message(
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


def lock_session(conn: Conn, session_id: str) -> float | None:
    row = conn.execute(
        sa.select(sessions.c.last_message_at)
        .where(sessions.c.id == session_id)
        .with_for_update()  # ignored by SQLite, whose writer already holds the database lock
    ).first()
    if row is None:
        raise SessionNotFound(f"no session {session_id}")
    return cast(float | None, row.last_message_at)


def run_of(row: sa.Row[Any]) -> Run:
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
