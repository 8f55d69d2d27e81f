"""What the store holds and hands out: users, keys, chats, messages, file records, runs."""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

SessionStatus = Literal["PENDING", "DONE", "ERROR"]
RunState = Literal["queued", "running", "done", "error", "cancelled"]
ACTIVE_RUN_STATES = ("queued", "running")
# Why a question was refused before anything was stored (see `RunQueue.start`).
StartRefusal = Literal["busy", "user_limit", "total_limit", "no_question"]
CancelOutcome = Literal["none", "requested", "ended"]
ReleaseOutcome = Literal["released", "answered", "lost"]
Role = Literal["user", "assistant", "tool", "trace"]
Origin = Literal["user", "assistant"]
CANCELLED = "cancelled"  # the status message of a chat whose run was cancelled
TITLE_MAX = 200  # characters of a chat's title (a given name, or its first question)

SECRET_PREFIX = "sb_"  # noqa: S105 - a public marker that makes leaked keys greppable

# Timestamps are doubles (8 bytes in both SQLite and PostgreSQL). Near 1.7e9 their spacing is
# ~2.4e-7 s, so a 1 µs step always yields a distinct, strictly larger value.
TIMESTAMP_STEP = 1e-6


@dataclass(frozen=True)
class User:
    id: str
    name: str
    created_at: float


@dataclass(frozen=True)
class ApiKey:
    id: str  # short and public: shown in listings, named when revoking
    user_id: str
    user_name: str
    created_at: float
    revoked_at: float | None = None
    last_used_at: float | None = None  # recorded about once a minute at most (see `key_used`)

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True)
class ChatSession:
    """A chat: what the interpreter API calls a session (its id is the session id)."""

    id: str
    user_id: str
    status: SessionStatus
    status_message: str | None
    created_at: float
    ttl: float  # POSIX seconds after which the session may be deleted
    # As read: the name its user gave, else its first question (cut to TITLE_MAX); None
    # before either. As stored, only the given name.
    title: str | None = None


@dataclass(frozen=True)
class Message:
    session_id: str
    timestamp: float  # unique and strictly increasing within a session, assigned at commit
    role: Role
    content: str
    internal: bool


@dataclass(frozen=True)
class FileRecord:
    session_id: str
    filename: str
    size: int
    origin: Origin
    updated_at: float


@dataclass(frozen=True)
class Run:
    """The run of one posted question: a job that one replica at a time holds under a lease."""

    id: str
    session_id: str
    user_id: str
    question_at: float  # the timestamp of the question message
    state: RunState
    owner: str | None  # the replica holding the lease (kept after the run ends)
    lease_until: float | None
    cancel_requested: bool
    attempts: int  # claims so far: more than one means another replica worked on it before
    created_at: float
    message: str | None = None  # how it ended
    preferred: str | None = None  # the replica holding the session's sandbox, if any


def new_user(name: str) -> User:
    return User(id=str(uuid.uuid4()), name=name, created_at=time.time())


def new_chat(user_id: str, ttl_seconds: float) -> ChatSession:
    """A chat just created: DONE with nothing asked yet, deletable `ttl_seconds` from now."""
    now = time.time()
    return ChatSession(str(uuid.uuid4()), user_id, "DONE", None, now, now + ttl_seconds)


class StartTerms(TypedDict):
    """The terms on which `RunQueue.start` starts a question: the limits it counts, and who
    holds the run (see `posted_run`)."""

    max_per_user: int
    max_total: int
    owner: str | None
    lease_seconds: float
    affinity: NotRequired[bool]  # False when not given


def start_refusal(
    status: SessionStatus,
    user_id: str,
    pending: Callable[[str | None], int],
    terms: StartTerms,
) -> StartRefusal | None:
    """Why a question may not start in the user's chat of `status` (None: it may), in the
    order `RunQueue.start` checks. `pending(user_id)` counts the user's PENDING chats and
    `pending(None)` everyone's, each only when reached, in the unit of work that starts the
    run. `no_question` is the caller's to decide after these (its store has the messages)."""
    if status == "PENDING":
        return "busy"
    if pending(user_id) >= terms["max_per_user"]:
        return "user_limit"
    if pending(None) >= terms["max_total"]:
        return "total_limit"
    return None


def posted_run(
    question: Message, user_id: str, terms: StartTerms, *, sandbox_replica: str | None
) -> Run:
    """The run of a question just stored: held by `terms["owner"]` at once when given, else
    queued. With `terms["affinity"]`, a chat whose sandbox lives on another replica has its
    run queued, preferring that replica (it is left to it, for a moment)."""
    now = time.time()
    owner = terms["owner"]
    affinity = terms.get("affinity", False)
    preferred = sandbox_replica if affinity and sandbox_replica != owner else None
    holder = owner if preferred is None else None
    return Run(
        id=str(uuid.uuid4()),
        session_id=question.session_id,
        user_id=user_id,
        question_at=question.timestamp,
        state="queued" if holder is None else "running",
        owner=holder,
        lease_until=None if holder is None else now + terms["lease_seconds"],
        cancel_requested=False,
        attempts=0 if holder is None else 1,
        created_at=now,
        preferred=preferred,
    )


def unattended(run: Run, now: float) -> bool:
    """Whether no replica works on the run: queued, or its lease expired by `now` (a run
    being cancelled then ends at once, see `RunQueue.request_cancel`)."""
    return run.state == "queued" or (run.lease_until or 0) < now


def new_secret() -> str:
    """A fresh API key secret: 32 random bytes, URL-safe, with a recognisable prefix."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return secrets.token_hex(6)


def hash_secret(secret: str) -> str:
    # Secrets carry 256 bits of entropy, so a fast unsalted hash cannot be brute-forced, and
    # looking keys up by hash means no secret-dependent comparison ever happens.
    return hashlib.sha256(secret.encode()).hexdigest()


def next_timestamp(last: float | None) -> float:
    """The timestamp for a new message given the session's latest one (clocks may step back)."""
    now = time.time()
    return now if last is None else max(now, last + TIMESTAMP_STEP)
