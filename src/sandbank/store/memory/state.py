"""What the in-memory store holds, shared by its aggregates, with the steps they compose.

Every aggregate's method runs to completion without awaiting, so on one event loop each is
atomic: that is this fake's unit of work.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sandbank.errors import LeaseLost, SessionNotFound
from sandbank.store.records import (
    ACTIVE_RUN_STATES,
    ApiKey,
    ChatSession,
    FileRecord,
    Message,
    Role,
    Run,
    SessionStatus,
    User,
    next_timestamp,
)


@dataclass(frozen=True)
class Reservation:
    """Storage reserved for a file on its way in (see `FileRecords`)."""

    user_id: str
    session_id: str
    filename: str
    size: int
    expires_at: float


@dataclass
class MemoryState:
    """The tables, as dicts."""

    users: dict[str, User] = field(default_factory=dict)  # by id
    keys: dict[str, tuple[ApiKey, str]] = field(default_factory=dict)  # by id: (key, hash)
    chats: dict[str, ChatSession] = field(default_factory=dict)
    messages: dict[str, list[Message]] = field(default_factory=dict)  # by chat, oldest first
    files: dict[tuple[str, str], FileRecord] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)
    uploads: dict[str, dict[str, float]] = field(default_factory=dict)
    sandboxes: dict[str, tuple[str, str]] = field(default_factory=dict)  # (replica, sandbox)
    reservations: dict[str, Reservation] = field(default_factory=dict)  # by id

    def chat(self, session_id: str) -> ChatSession:
        try:
            return self.chats[session_id]
        except KeyError:
            raise SessionNotFound(f"no session {session_id}") from None

    def set_status(self, session_id: str, status: SessionStatus, message: str | None) -> None:
        chat = self.chat(session_id)
        self.chats[session_id] = dataclasses.replace(chat, status=status, status_message=message)

    def append(self, session_id: str, role: Role, content: str, internal: bool) -> Message:
        self.chat(session_id)
        log = self.messages[session_id]
        stamp = next_timestamp(log[-1].timestamp if log else None)
        message = Message(session_id, stamp, role, content, internal)
        log.append(message)
        return message

    def drop_chat(self, session_id: str) -> None:
        """The chat and everything it owns."""
        del self.chats[session_id]
        del self.messages[session_id]
        self.runs = {k: r for k, r in self.runs.items() if r.session_id != session_id}
        self.uploads.pop(session_id, None)
        self.sandboxes.pop(session_id, None)
        self.files = {k: v for k, v in self.files.items() if k[0] != session_id}
        self.reservations = {
            k: r for k, r in self.reservations.items() if r.session_id != session_id
        }

    def held(self, run: Run) -> Run | None:
        """The run as stored, while `run.owner` holds it (and its chat exists)."""
        current = self.runs.get(run.id)
        if current is None or current.owner != run.owner or current.state != "running":
            return None
        return current if run.session_id in self.chats else None

    def hold(self, run: Run) -> Run:
        """`held`, or `LeaseLost`."""
        current = self.held(run)
        if current is None:
            raise LeaseLost(f"run {run.id} is no longer held by {run.owner}")
        return current

    def active_run(self, session_id: str) -> Run | None:
        active = (
            r
            for r in self.runs.values()
            if r.session_id == session_id and r.state in ACTIVE_RUN_STATES
        )
        return next(active, None)

    def count_pending(self, user_id: str | None = None) -> int:
        return sum(
            1
            for c in self.chats.values()
            if c.status == "PENDING" and (user_id is None or c.user_id == user_id)
        )
