"""The store's vocabulary: users, keys, sessions, messages, file records; the `Store` Protocol."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Literal, Protocol

from sandbank.errors import SandbankError

SessionStatus = Literal["PENDING", "DONE", "ERROR"]
RunState = Literal["queued", "running", "done", "error", "cancelled"]
ACTIVE_RUN_STATES = ("queued", "running")
# Why a question was refused before anything was stored (see `Store.start_run`).
StartRefusal = Literal["busy", "user_limit", "total_limit"]
CancelOutcome = Literal["none", "requested", "ended"]
ReleaseOutcome = Literal["released", "answered", "lost"]
Role = Literal["user", "assistant", "tool", "trace"]
Origin = Literal["user", "assistant"]

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
    id: str
    user_id: str
    status: SessionStatus
    status_message: str | None
    created_at: float
    ttl: float  # POSIX seconds after which the session may be deleted


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


class LeaseLost(SandbankError):
    """The replica no longer holds the run (taken over, or its session deleted): stop it."""


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


class Store(Protocol):
    """Persistent state of the interpreter API. Every method is safe to call concurrently.

    Lookups return None when nothing matches; mutations of a missing session raise
    `SessionNotFound`, of a missing user or key `NotFound`; a duplicate user name `Conflict`.
    """

    async def close(self) -> None: ...

    # --- users and API keys ----------------------------------------------------------------
    async def create_user(self, name: str) -> User: ...
    async def get_user(self, name: str) -> User | None: ...
    async def get_user_by_id(self, user_id: str) -> User | None: ...

    async def delete_user(self, name: str) -> list[str]:
        """Remove the user and all they own; returns their session ids (for objects, sandboxes)."""
        ...

    async def create_key(self, user_name: str) -> tuple[ApiKey, str]:
        """A new key and its secret; the secret is never stored and cannot be shown again."""
        ...

    async def list_keys(self, user_name: str | None = None) -> list[ApiKey]: ...
    async def revoke_key(self, key_id: str) -> None: ...
    async def authenticate(self, secret: str) -> User | None: ...

    async def key_used(self, secret: str, at: float) -> None:
        """Record that the key with this secret was used at `at`; an earlier time, or a secret
        that names no key, changes nothing."""
        ...

    # --- sessions ----------------------------------------------------------------------------
    async def create_session(self, user_id: str, ttl_seconds: float) -> ChatSession: ...
    async def get_session(self, session_id: str) -> ChatSession | None: ...

    async def list_sessions(self, user_id: str) -> list[ChatSession]:
        """The user's sessions, newest first."""
        ...

    async def delete_session(self, session_id: str) -> bool:
        """Delete a session with its messages and file records; False if there was none."""
        ...

    async def try_start_run(self, session_id: str, status_message: str | None) -> bool:
        """Atomically move DONE/ERROR to PENDING; False if a run is already pending."""
        ...

    async def set_status(
        self, session_id: str, status: SessionStatus, message: str | None = None
    ) -> None: ...

    async def fail_orphan_pending(self, message: str) -> list[str]:
        """PENDING sessions without a queued or running run (left by a server before runs were
        jobs) become ERROR `message`; safe while other replicas work."""
        ...

    async def expired_sessions(self, now: float) -> list[str]:
        """Ids of sessions whose ttl is at or before `now`."""
        ...

    async def count_sessions(self, user_id: str) -> int: ...
    async def count_pending(self, user_id: str | None = None) -> int: ...

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
        """One transaction: check the limits (counted under a lock, so they hold for every
        replica), move the session to PENDING, store the question and its run. The run is
        claimed by `owner` at once when given, else queued. With `affinity`, a session whose
        sandbox lives on another replica has its run queued, preferring that replica.
        Refusals store nothing."""
        ...

    async def claim_runs(
        self, owner: str, limit: int, lease_seconds: float, affinity_seconds: float = 0.0
    ) -> list[Run]:
        """Claim up to `limit` queued runs and runs whose lease expired, oldest first; no run
        is ever claimed by two replicas (row locks skipped, or the single SQLite writer). A run
        preferring another replica is left to it for `affinity_seconds`."""
        ...

    async def note_sandbox(self, session_id: str, replica: str, sandbox_id: str) -> None:
        """The session's sandbox now lives on `replica` (a missing session is ignored)."""
        ...

    async def session_sandbox(self, session_id: str) -> tuple[str | None, str | None]:
        """(replica, sandbox id) of the session's latest sandbox."""
        ...

    async def renew_runs(
        self, owner: str, run_ids: list[str], lease_seconds: float
    ) -> dict[str, bool]:
        """Extend the leases `owner` still holds: {run id: cancel requested}. A run missing
        from the answer is lost (taken over, deleted): its replica must stop it."""
        ...

    async def finish_run(
        self, run: Run, status: SessionStatus, message: str | None, state: RunState
    ) -> bool:
        """End the run and set its session's status together; False (nothing written) when
        `run.owner` no longer holds it."""
        ...

    async def release_run(self, run: Run, status_message: str | None) -> ReleaseOutcome:
        """Hand the run back (queued, no lease) so another replica continues it at once;
        `answered` (the run ended DONE instead) when its answer is already stored, decided
        under the session's lock so an answer is never given twice; `lost` when not held."""
        ...

    async def request_cancel(self, session_id: str) -> CancelOutcome:
        """Flag the session's run for cancelling; a queued run, or one whose lease expired,
        ends at once (`ended`, the session ERROR "cancelled"). `none`: no run in progress."""
        ...

    async def get_run(self, run_id: str) -> Run | None: ...
    async def active_run(self, session_id: str) -> Run | None: ...

    async def expire_leases(self) -> int:
        """Make every running run's lease expire now (its replica is known to be gone)."""
        ...

    async def set_progress(self, run: Run, message: str) -> None:
        """The session's status message, while `run.owner` holds the run (else `LeaseLost`)."""
        ...

    # --- messages ----------------------------------------------------------------------------
    async def add_message(
        self,
        session_id: str,
        role: Role,
        content: str,
        internal: bool = False,
        fence: Run | None = None,
    ) -> Message:
        """Append a message; its timestamp is later than every earlier one of the session.

        With `fence`, only while `fence.owner` holds that run (else `LeaseLost`, nothing stored).
        """
        ...

    async def list_messages(self, session_id: str, after: float | None = None) -> list[Message]:
        """Messages oldest first, only those strictly after `after` when given."""
        ...

    # --- file records ------------------------------------------------------------------------
    async def upsert_file(
        self, session_id: str, filename: str, size: int, origin: Origin
    ) -> FileRecord: ...
    async def list_files(self, session_id: str) -> list[FileRecord]: ...
    async def get_file(self, session_id: str, filename: str) -> FileRecord | None: ...
    async def delete_file(self, session_id: str, filename: str) -> bool: ...

    async def user_stored_bytes(self, user_id: str) -> int:
        """Total size of the files recorded in the user's sessions."""
        ...

    # --- upload forms awaiting their object (S3) ---------------------------------------------
    async def note_upload(self, session_id: str, filename: str, expires_at: float) -> None: ...
    async def pending_uploads(self, session_id: str) -> dict[str, float]:
        """{filename: when its form expires} of forms handed out by any replica."""
        ...

    async def drop_upload(self, session_id: str, filename: str) -> None: ...
