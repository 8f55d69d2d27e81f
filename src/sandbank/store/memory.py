"""An in-memory `Store` for tests and throwaway servers: same behaviour, nothing persisted."""

from __future__ import annotations

import dataclasses
import time
import uuid

from sandbank.errors import Conflict, NotFound, SessionNotFound
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
    next_timestamp,
)

# Every method runs to completion without awaiting, so on one event loop each is atomic:
# that is this fake's "transaction".


class MemoryStore:
    """The store in memory: the fake for tests."""

    def __init__(self) -> None:
        self._users: dict[str, User] = {}  # by id
        self._keys: dict[str, tuple[ApiKey, str]] = {}  # by key id: (key, secret hash)
        self._sessions: dict[str, ChatSession] = {}
        self._messages: dict[str, list[Message]] = {}
        self._files: dict[tuple[str, str], FileRecord] = {}
        self._runs: dict[str, Run] = {}
        self._uploads: dict[str, dict[str, float]] = {}
        self._sandboxes: dict[str, tuple[str, str]] = {}  # session → (replica, sandbox id)

    async def close(self) -> None:
        pass

    # --- users and API keys ----------------------------------------------------------------
    def _user_named(self, name: str) -> User | None:
        return next((u for u in self._users.values() if u.name == name), None)

    async def create_user(self, name: str) -> User:
        if self._user_named(name) is not None:
            raise Conflict(f"user {name!r} exists")
        user = User(id=str(uuid.uuid4()), name=name, created_at=time.time())
        self._users[user.id] = user
        return user

    async def get_user(self, name: str) -> User | None:
        return self._user_named(name)

    async def get_user_by_id(self, user_id: str) -> User | None:
        return self._users.get(user_id)

    async def delete_user(self, name: str) -> list[str]:
        user = self._user_named(name)
        if user is None:
            raise NotFound(f"no user {name!r}")
        ids = [s.id for s in self._sessions.values() if s.user_id == user.id]
        for sid in ids:
            self._drop_session(sid)
        self._keys = {k: v for k, v in self._keys.items() if v[0].user_id != user.id}
        del self._users[user.id]
        return ids

    async def create_key(self, user_name: str) -> tuple[ApiKey, str]:
        user = self._user_named(user_name)
        if user is None:
            raise NotFound(f"no user {user_name!r}")
        secret = new_secret()
        key = ApiKey(new_key_id(), user.id, user.name, time.time())
        self._keys[key.id] = (key, hash_secret(secret))
        return key, secret

    async def list_keys(self, user_name: str | None = None) -> list[ApiKey]:
        keys = [k for k, _ in self._keys.values()]
        if user_name is not None:
            keys = [k for k in keys if k.user_name == user_name]
        return sorted(keys, key=lambda k: k.created_at)

    async def revoke_key(self, key_id: str) -> None:
        if key_id not in self._keys:
            raise NotFound(f"no key {key_id!r}")
        key, digest = self._keys[key_id]
        if key.revoked_at is None:
            self._keys[key_id] = (dataclasses.replace(key, revoked_at=time.time()), digest)

    async def authenticate(self, secret: str) -> User | None:
        digest = hash_secret(secret)
        for key, stored in self._keys.values():
            if stored == digest and not key.revoked:
                return self._users.get(key.user_id)
        return None

    async def key_used(self, secret: str, at: float) -> None:
        digest = hash_secret(secret)
        for key_id, (key, stored) in self._keys.items():
            if stored == digest and (key.last_used_at or 0.0) < at:
                self._keys[key_id] = (dataclasses.replace(key, last_used_at=at), digest)

    # --- sessions ----------------------------------------------------------------------------
    async def create_session(self, user_id: str, ttl_seconds: float) -> ChatSession:
        if user_id not in self._users:
            raise NotFound(f"no user with id {user_id!r}")
        now = time.time()
        session = ChatSession(str(uuid.uuid4()), user_id, "DONE", None, now, now + ttl_seconds)
        self._sessions[session.id] = session
        self._messages[session.id] = []
        return session

    async def get_session(self, session_id: str) -> ChatSession | None:
        return self._sessions.get(session_id)

    async def list_sessions(self, user_id: str) -> list[ChatSession]:
        mine = [s for s in self._sessions.values() if s.user_id == user_id]
        return sorted(mine, key=lambda s: s.created_at, reverse=True)

    def _drop_session(self, session_id: str) -> None:
        del self._sessions[session_id]
        del self._messages[session_id]
        self._runs = {k: r for k, r in self._runs.items() if r.session_id != session_id}
        self._uploads.pop(session_id, None)
        self._sandboxes.pop(session_id, None)
        self._files = {k: v for k, v in self._files.items() if k[0] != session_id}

    async def delete_session(self, session_id: str) -> bool:
        if session_id not in self._sessions:
            return False
        self._drop_session(session_id)
        return True

    def _session(self, session_id: str) -> ChatSession:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"no session {session_id}") from None

    async def try_start_run(self, session_id: str, status_message: str | None) -> bool:
        session = self._session(session_id)
        if session.status == "PENDING":
            return False
        self._sessions[session_id] = dataclasses.replace(
            session, status="PENDING", status_message=status_message
        )
        return True

    async def set_status(
        self, session_id: str, status: SessionStatus, message: str | None = None
    ) -> None:
        session = self._session(session_id)
        self._sessions[session_id] = dataclasses.replace(
            session, status=status, status_message=message
        )

    async def fail_orphan_pending(self, message: str) -> list[str]:
        running = {r.session_id for r in self._runs.values() if r.state in ACTIVE_RUN_STATES}
        ids = [
            s.id for s in self._sessions.values() if s.status == "PENDING" and s.id not in running
        ]
        for sid in ids:
            await self.set_status(sid, "ERROR", message)
        return ids

    async def expired_sessions(self, now: float) -> list[str]:
        return [s.id for s in self._sessions.values() if s.ttl <= now]

    async def count_sessions(self, user_id: str) -> int:
        return sum(1 for s in self._sessions.values() if s.user_id == user_id)

    async def count_pending(self, user_id: str | None = None) -> int:
        return sum(
            1
            for s in self._sessions.values()
            if s.status == "PENDING" and (user_id is None or s.user_id == user_id)
        )

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
        session = self._session(session_id)
        if session.status == "PENDING":
            return "busy"
        if await self.count_pending(session.user_id) >= max_per_user:
            return "user_limit"
        if await self.count_pending() >= max_total:
            return "total_limit"
        await self.set_status(session_id, "PENDING", "starting")
        question = await self.add_message(session_id, "user", content)
        now = time.time()
        replica = self._sandboxes.get(session_id, (None, None))[0]
        preferred = replica if affinity and replica != owner else None
        if preferred is not None:
            owner = None
        run = Run(
            id=str(uuid.uuid4()),
            session_id=session_id,
            user_id=session.user_id,
            question_at=question.timestamp,
            state="queued" if owner is None else "running",
            owner=owner,
            lease_until=None if owner is None else now + lease_seconds,
            cancel_requested=False,
            attempts=0 if owner is None else 1,
            created_at=now,
            preferred=preferred,
        )
        self._runs[run.id] = run
        return question, run

    async def claim_runs(
        self, owner: str, limit: int, lease_seconds: float, affinity_seconds: float = 0.0
    ) -> list[Run]:
        now = time.time()

        def mine_to_take(r: Run) -> bool:
            return r.preferred in (None, owner) or r.created_at <= now - affinity_seconds

        claimable = sorted(
            (
                r
                for r in self._runs.values()
                if (r.state == "queued" and mine_to_take(r))
                or (r.state == "running" and (r.lease_until or 0) < now)
            ),
            key=lambda r: r.created_at,
        )
        claimed = []
        for run in claimable[: max(limit, 0)]:
            run = dataclasses.replace(
                run,
                state="running",
                owner=owner,
                lease_until=now + lease_seconds,
                attempts=run.attempts + 1,
            )
            self._runs[run.id] = claimed_run = run
            claimed.append(claimed_run)
        return claimed

    def _held(self, run: Run) -> Run | None:
        current = self._runs.get(run.id)
        if current is None or current.owner != run.owner or current.state != "running":
            return None
        return current

    async def renew_runs(
        self, owner: str, run_ids: list[str], lease_seconds: float
    ) -> dict[str, bool]:
        renewed = {}
        for run_id in run_ids:
            current = self._runs.get(run_id)
            if current is not None and current.owner == owner and current.state == "running":
                lease = time.time() + lease_seconds
                self._runs[run_id] = dataclasses.replace(current, lease_until=lease)
                renewed[run_id] = current.cancel_requested
        return renewed

    async def finish_run(
        self, run: Run, status: SessionStatus, message: str | None, state: RunState
    ) -> bool:
        current = self._held(run)
        if current is None or run.session_id not in self._sessions:
            return False
        self._runs[run.id] = dataclasses.replace(
            current, state=state, lease_until=None, message=message
        )
        await self.set_status(run.session_id, status, message)
        return True

    async def release_run(self, run: Run, status_message: str | None) -> ReleaseOutcome:
        current = self._held(run)
        if current is None or run.session_id not in self._sessions:
            return "lost"
        if any(
            m.timestamp > run.question_at and m.role == "assistant" and not m.internal
            for m in self._messages[run.session_id]
        ):
            self._runs[run.id] = dataclasses.replace(current, state="done", lease_until=None)
            await self.set_status(run.session_id, "DONE", None)
            return "answered"
        self._runs[run.id] = dataclasses.replace(
            current, state="queued", owner=None, lease_until=None
        )
        await self.set_status(run.session_id, "PENDING", status_message)
        return "released"

    async def request_cancel(self, session_id: str) -> CancelOutcome:
        self._session(session_id)
        run = await self.active_run(session_id)
        if run is None:
            return "none"
        if run.state == "queued" or (run.lease_until or 0) < time.time():
            self._runs[run.id] = dataclasses.replace(
                run, state="cancelled", cancel_requested=True, lease_until=None, message="cancelled"
            )
            await self.set_status(session_id, "ERROR", "cancelled")
            return "ended"
        self._runs[run.id] = dataclasses.replace(run, cancel_requested=True)
        return "requested"

    async def note_sandbox(self, session_id: str, replica: str, sandbox_id: str) -> None:
        if session_id in self._sessions:
            self._sandboxes[session_id] = (replica, sandbox_id)

    async def session_sandbox(self, session_id: str) -> tuple[str | None, str | None]:
        return self._sandboxes.get(session_id, (None, None))

    async def get_run(self, run_id: str) -> Run | None:
        return self._runs.get(run_id)

    async def active_run(self, session_id: str) -> Run | None:
        return next(
            (
                r
                for r in self._runs.values()
                if r.session_id == session_id and r.state in ACTIVE_RUN_STATES
            ),
            None,
        )

    async def expire_leases(self) -> int:
        running = [r for r in self._runs.values() if r.state == "running"]
        for run in running:
            self._runs[run.id] = dataclasses.replace(run, lease_until=0.0)
        return len(running)

    async def set_progress(self, run: Run, message: str) -> None:
        if self._held(run) is None or run.session_id not in self._sessions:
            raise LeaseLost(f"run {run.id} is no longer held by {run.owner}")
        await self.set_status(run.session_id, "PENDING", message)

    # --- messages ----------------------------------------------------------------------------
    async def add_message(
        self,
        session_id: str,
        role: Role,
        content: str,
        internal: bool = False,
        fence: Run | None = None,
    ) -> Message:
        self._session(session_id)
        if fence is not None and self._held(fence) is None:
            raise LeaseLost(f"run {fence.id} is no longer held by {fence.owner}")
        log = self._messages[session_id]
        stamp = next_timestamp(log[-1].timestamp if log else None)
        message = Message(session_id, stamp, role, content, internal)
        log.append(message)
        return message

    async def list_messages(self, session_id: str, after: float | None = None) -> list[Message]:
        log = self._messages.get(session_id, [])
        return [m for m in log if after is None or m.timestamp > after]

    # --- file records ------------------------------------------------------------------------
    async def upsert_file(
        self, session_id: str, filename: str, size: int, origin: Origin
    ) -> FileRecord:
        self._session(session_id)
        record = FileRecord(session_id, filename, size, origin, time.time())
        self._files[(session_id, filename)] = record
        return record

    async def list_files(self, session_id: str) -> list[FileRecord]:
        return sorted(
            (f for f in self._files.values() if f.session_id == session_id),
            key=lambda f: f.filename,
        )

    async def get_file(self, session_id: str, filename: str) -> FileRecord | None:
        return self._files.get((session_id, filename))

    async def delete_file(self, session_id: str, filename: str) -> bool:
        return self._files.pop((session_id, filename), None) is not None

    async def user_stored_bytes(self, user_id: str) -> int:
        return sum(
            f.size for f in self._files.values() if self._sessions[f.session_id].user_id == user_id
        )

    # --- upload forms awaiting their object (S3) ---------------------------------------------
    async def note_upload(self, session_id: str, filename: str, expires_at: float) -> None:
        self._session(session_id)
        self._uploads.setdefault(session_id, {})[filename] = expires_at

    async def pending_uploads(self, session_id: str) -> dict[str, float]:
        return dict(self._uploads.get(session_id, {}))

    async def drop_upload(self, session_id: str, filename: str) -> None:
        self._uploads.get(session_id, {}).pop(filename, None)
