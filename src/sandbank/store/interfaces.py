"""The store's interfaces: one Protocol per aggregate, and `Store`, which holds them together.

    Store            what the app holds: the aggregates over one database, and `close`
    ├── accounts     Accounts      users and their API keys
    ├── chats        Chats         interpreter sessions ("chats"), their messages, their sandbox
    ├── runs         RunQueue      the run of each posted question: a job leased by one replica
    └── file_records FileRecords   the files of each chat, and upload forms awaiting their object

Every method is safe to call concurrently and is one transaction (the unit of work is the
implementation's: `sql.database.Database`, or one event-loop step in memory); a method that
touches several aggregates, as `RunQueue.start` does, changes all of them or none. Lookups
return None when nothing matches; mutations of a missing chat raise `SessionNotFound`, of a
missing user or key `NotFound`; a duplicate user name `Conflict`; a write fenced by a run its
replica no longer holds `LeaseLost`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, Unpack

from sandbank.store.records import (
    ApiKey,
    CancelOutcome,
    ChatSession,
    FileRecord,
    Message,
    Origin,
    ReleaseOutcome,
    Role,
    Run,
    RunState,
    SessionStatus,
    StartRefusal,
    StartTerms,
    User,
)


class Accounts(Protocol):
    """Users and their API keys (a secret is never stored: only its hash)."""

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


class Chats(Protocol):
    """The interpreter API's sessions (chats here: "session" means too much elsewhere), read
    with their messages; their status and messages are written through `RunQueue`."""

    async def create(self, user_id: str, ttl_seconds: float) -> ChatSession: ...

    async def create_within(
        self, user_id: str, ttl_seconds: float, limit: int
    ) -> ChatSession | None:
        """A new chat, or None (nothing stored) when the user already has `limit` chats,
        counted in the same transaction: concurrent creations never pass the limit together."""
        ...

    async def get(self, session_id: str) -> ChatSession | None:
        """The chat, its `title` the given name or else its first question."""
        ...

    async def of_user(self, user_id: str) -> list[ChatSession]:
        """The user's chats, newest first, titled as `get` titles them."""
        ...

    async def rename(self, session_id: str, title: str | None) -> None:
        """Name the chat; None forgets the name (its first question shows again)."""
        ...

    async def count(self, user_id: str) -> int: ...

    async def delete(self, session_id: str) -> bool:
        """Delete a chat with its messages, run and file records; False if there was none."""
        ...

    async def expired(self, now: float) -> list[str]:
        """Ids of chats whose ttl is at or before `now`."""
        ...

    async def messages(self, session_id: str, after: float | None = None) -> list[Message]:
        """Messages oldest first, only those strictly after `after` when given."""
        ...

    async def note_sandbox(self, session_id: str, replica: str, sandbox_id: str) -> None:
        """The chat's sandbox now lives on `replica` (a missing chat is ignored)."""
        ...

    async def sandbox(self, session_id: str) -> tuple[str | None, str | None]:
        """(replica, sandbox id) of the chat's latest sandbox."""
        ...

    async def sandboxes_of(self, user_id: str) -> dict[str, tuple[str, str]]:
        """(replica, sandbox id) of the latest sandbox of each of the user's chats that had one,
        by chat id: one read for a list of chats."""
        ...


class RunQueue(Protocol):
    """Runs as leased jobs: a posted question's run is held by one replica at a time, which
    renews its lease; every write of a run is fenced by that lease."""

    async def start(
        self, session_id: str, content: str | None, **terms: Unpack[StartTerms]
    ) -> tuple[Message, Run] | StartRefusal:
        """One transaction: check the limits of `terms` (counted under a lock, so they hold
        for every replica), move the chat to PENDING, store the question and its run (see
        `records.posted_run` for who holds it). `content` None runs the chat's latest question
        again, storing no message (`no_question` when it has none). Refusals store nothing."""
        ...

    async def claim(
        self, owner: str, limit: int, lease_seconds: float, affinity_seconds: float = 0.0
    ) -> list[Run]:
        """Claim up to `limit` queued runs and runs whose lease expired, oldest first; no run
        is ever claimed by two replicas (row locks skipped, or the single SQLite writer). A run
        preferring another replica is left to it for `affinity_seconds`."""
        ...

    async def renew(self, owner: str, run_ids: list[str], lease_seconds: float) -> dict[str, bool]:
        """Extend the leases `owner` still holds: {run id: cancel requested}. A run missing
        from the answer is lost (taken over, deleted): its replica must stop it."""
        ...

    async def add_message(self, run: Run, role: Role, content: str, internal: bool) -> Message:
        """Append a message to the run's chat, while `run.owner` holds the run (else
        `LeaseLost`, nothing stored); its timestamp is later than every earlier one."""
        ...

    async def set_progress(self, run: Run, message: str) -> None:
        """The chat's status message, while `run.owner` holds the run (else `LeaseLost`)."""
        ...

    async def finish(
        self, run: Run, status: SessionStatus, message: str | None, state: RunState
    ) -> bool:
        """End the run and set its chat's status together; False (nothing written) when
        `run.owner` no longer holds it."""
        ...

    async def release(self, run: Run, status_message: str | None) -> ReleaseOutcome:
        """Hand the run back (queued, no lease) so another replica continues it at once;
        `answered` (the run ended DONE instead) when its answer is already stored, decided
        under the chat's lock so an answer is never given twice; `lost` when not held."""
        ...

    async def request_cancel(self, session_id: str) -> CancelOutcome:
        """Flag the chat's run for cancelling; a queued run, or one whose lease expired,
        ends at once (`ended`, the chat ERROR "cancelled"). `none`: no run in progress."""
        ...

    async def expire_leases(self) -> int:
        """Make every running run's lease expire now (its replica is known to be gone)."""
        ...

    async def fail_orphan_pending(self, message: str) -> list[str]:
        """PENDING chats without a queued or running run (left by a server before runs were
        jobs) become ERROR `message`; safe while other replicas work."""
        ...


class FileRecords(Protocol):
    """What each chat's files are (their bytes are in the object store), the upload forms
    handed out for an object store that calls nobody back (S3), until they expire, and the
    storage reserved for files on their way in.

    The storage quota is a reservation: bytes are reserved (counted with the user's stored
    files and every other live reservation, in one transaction) before they are written,
    grown as they arrive, and either committed as the file's record or released. A
    reservation that is neither (its server died) stops counting at its `expires_at`.
    """

    async def upsert(
        self, session_id: str, filename: str, size: int, origin: Origin
    ) -> FileRecord: ...
    async def get(self, session_id: str, filename: str) -> FileRecord | None: ...

    async def delete(self, session_id: str, filename: str) -> bool:
        """Forget the file's record (and any upload form for it); False if there was none."""
        ...

    async def of_session(self, session_id: str) -> list[FileRecord]:
        """The chat's file records, by filename."""
        ...

    async def stored_bytes(self, user_id: str) -> int:
        """Total size of the files recorded in the user's chats."""
        ...

    async def note_upload(self, session_id: str, filename: str, expires_at: float) -> None: ...

    async def pending_uploads(self, session_id: str) -> dict[str, float]:
        """{filename: when its form expires} of forms handed out by any replica."""
        ...

    async def drop_upload(self, session_id: str, filename: str) -> None: ...

    async def reserve(
        self,
        reservation_id: str,
        session_id: str,
        filename: str,
        size: int,
        quota: int,
        expires_at: float,
    ) -> bool:
        """Reserve `size` bytes for a file of the chat (`reservation_id` given by the caller,
        a reservation of that id replaced) if the chat's user stays within `quota`: their
        files, less the one this file replaces, plus their live reservations. False (nothing
        stored) otherwise; `SessionNotFound` without the chat."""
        ...

    async def release(self, reservation_id: str) -> None:
        """Drop a reservation (an unknown one is ignored)."""
        ...

    async def commit(
        self, reservation_id: str, session_id: str, filename: str, size: int, origin: Origin
    ) -> FileRecord:
        """Record the file and drop its reservation, in one transaction."""
        ...


@dataclass(frozen=True)
class Store:
    """The aggregates over one database: `store.accounts.create_user(...)`."""

    accounts: Accounts
    chats: Chats
    runs: RunQueue
    file_records: FileRecords
    closer: Callable[[], Awaitable[None]]

    async def close(self) -> None:
        """Release the database (its connections); the store is not used after."""
        await self.closer()
