"""The store's vocabulary: users, keys, sessions, messages, file records; the `Store` Protocol."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Literal, Protocol

SessionStatus = Literal["PENDING", "DONE", "ERROR"]
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

    async def fail_pending_runs(self, message: str) -> list[str]:
        """At start-up: every PENDING session (its run died with the old process) becomes ERROR."""
        ...

    async def expired_sessions(self, now: float) -> list[str]:
        """Ids of sessions whose ttl is at or before `now`."""
        ...

    async def count_sessions(self, user_id: str) -> int: ...
    async def count_pending(self, user_id: str | None = None) -> int: ...

    # --- messages ----------------------------------------------------------------------------
    async def add_message(
        self, session_id: str, role: Role, content: str, internal: bool = False
    ) -> Message:
        """Append a message; its timestamp is later than every earlier one of the session."""
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
