"""Agent runs of sessions: one background task each, on a leased sandbox, recorded in the store.

A run leases the session's sandbox (a new one when the provider reclaimed it, and the agent
is told), places the session's files in its workspace (uploads read-only), runs the agent
loop, then saves the files it created or changed as the session's `assistant` files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread

from sandbank.agent.interfaces import FileInfo, HistoryMessage
from sandbank.agent.loop import RunLimits, run_turn
from sandbank.agent.model import Model
from sandbank.agent.records import Role
from sandbank.config import Settings
from sandbank.errors import (
    AtCapacity,
    BadRequest,
    Conflict,
    NotFound,
    PayloadTooLarge,
    RunInProgress,
    SandbankError,
    SessionNotFound,
    TooManyRuns,
)
from sandbank.files import object_key, validate_stored_name
from sandbank.interpreter.files import SessionFiles
from sandbank.leasing import FileEntry, Sandboxes
from sandbank.sandbox.base import ExecResult, ToolCall
from sandbank.store import ChatSession, Message, SessionStatus, Store

log = logging.getLogger(__name__)

SHUTTING_DOWN = "server shutting down"
STOP_WAIT_S = 15.0  # how long stopping a run waits for it to record how it ended


@dataclass
class Lease:
    """A session's sandbox, and which version of each session file is already in it."""

    sandbox_id: str
    owner: str
    placed: dict[str, float] = field(default_factory=dict)  # filename → record.updated_at


@dataclass
class ActiveRun:
    task: asyncio.Task[None]
    cancel: anyio.Event
    stop_reason: str | None = None  # set when the task is cancelled: shutdown or deletion


class StoreRecorder:
    """The agent's `Recorder`: messages and progress go to the session in the store."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id

    async def add_message(self, role: Role, content: str, internal: bool) -> None:
        await self.store.add_message(self.session_id, role, content, internal)

    async def set_status(self, message: str) -> None:
        await self.store.set_status(self.session_id, "PENDING", message)


class SandboxWorkbench:
    """The agent's `Workbench`: one leased sandbox."""

    def __init__(self, sandboxes: Sandboxes, sandbox_id: str, owner: str) -> None:
        self.sandboxes = sandboxes
        self.sandbox_id = sandbox_id
        self.owner = owner

    async def execute(self, call: ToolCall, timeout_s: float) -> ExecResult:
        return await self.sandboxes.execute(self.sandbox_id, self.owner, call, timeout_s)

    async def list_files(self) -> list[FileInfo]:
        entries = await self.sandboxes.list_files(self.sandbox_id, self.owner)
        return [FileInfo(e.path, e.size) for e in entries]


def owner_of(user_id: str) -> str:
    return f"interp:{user_id}"


class Runs:
    """Starts, cancels and stops the agent runs of sessions."""

    def __init__(
        self,
        store: Store,
        files: SessionFiles,
        sandboxes: Sandboxes,
        model: Model | SandbankError,
        settings: Settings,
    ) -> None:
        self.store = store
        self.files = files
        self.sandboxes = sandboxes
        self.model = model  # the error that prevented building it, when not configured
        self.settings = settings
        self.limits = RunLimits.from_settings(settings)
        self.leases: dict[str, Lease] = {}
        self.active: dict[str, ActiveRun] = {}
        # Limits are counted then claimed: one server per database, so a process lock suffices.
        self._start_lock = asyncio.Lock()
        self._closing = False

    # --- starting, cancelling, stopping ------------------------------------------------------
    async def begin(self, session: ChatSession, content: str) -> Message:
        """Store the question and start its run; refuses before storing anything."""
        if isinstance(self.model, SandbankError):
            # A fresh error each time: raising the stored one would grow its traceback
            # and keep every request's frames alive.
            raise type(self.model)(self.model.message)
        if self._closing:
            raise AtCapacity(SHUTTING_DOWN, retry_after=30)
        s = self.settings
        busy = (
            "a run is already in progress in this session: wait until its status is DONE or "
            "ERROR (or cancel it with POST /api/sessions/{id}/cancel), then post again"
        )
        async with self._start_lock:
            if session.status == "PENDING":
                raise RunInProgress(busy)
            if await self.store.count_pending(session.user_id) >= s.max_runs_per_user:
                raise TooManyRuns(
                    f"you have {s.max_runs_per_user} runs in progress, the most allowed at once: "
                    "post again when one has ended"
                )
            if await self.store.count_pending() >= s.max_runs:
                raise AtCapacity(
                    f"the server is running {s.max_runs} agents, its limit: retry shortly",
                    retry_after=10,
                )
            if not await self.store.try_start_run(session.id, "starting"):
                raise RunInProgress(busy)
        try:
            history = await self.store.list_messages(session.id)
            question = await self.store.add_message(session.id, "user", content)
        except BaseException:
            with contextlib.suppress(SessionNotFound):
                await self.store.set_status(session.id, "ERROR", "the question was not stored")
            raise
        cancel = anyio.Event()
        task = asyncio.create_task(
            self._run(self.model, session, question, history, cancel),
            name=f"run {session.id}",
        )
        self.active[session.id] = ActiveRun(task, cancel)
        return question

    async def cancel(self, session_id: str) -> None:
        run = self.active.get(session_id)
        if run is None:
            raise Conflict("no run is in progress in this session")
        run.cancel.set()
        await asyncio.wait({run.task}, timeout=STOP_WAIT_S)

    async def stop(self, session_id: str, reason: str | None) -> None:
        """End the session's run (its status set to ERROR `reason`, unless None) and sandbox."""
        run = self.active.get(session_id)
        if run is not None:
            run.stop_reason = reason or ""
            run.task.cancel()
            await asyncio.wait({run.task}, timeout=STOP_WAIT_S)
        lease = self.leases.pop(session_id, None)
        if lease is not None:
            with contextlib.suppress(SandbankError):
                await self.sandboxes.destroy(lease.sandbox_id, lease.owner)

    async def shutdown(self) -> None:
        """Running turns end ERROR "server shutting down"; no new run starts."""
        self._closing = True
        runs = list(self.active.values())
        for run in runs:
            run.stop_reason = SHUTTING_DOWN
            run.task.cancel()
        if runs:
            await asyncio.wait({r.task for r in runs}, timeout=STOP_WAIT_S)

    # --- one run -----------------------------------------------------------------------------
    async def _run(
        self,
        model: Model,
        session: ChatSession,
        question: Message,
        history: list[Message],
        cancel: anyio.Event,
    ) -> None:
        sid, owner = session.id, owner_of(session.user_id)
        status: SessionStatus = "ERROR"
        message: str | None = "internal error"
        try:
            lease, recreated = await self._lease(sid, owner, had_history=bool(history))
            before = await self._place(sid, owner, lease)
            result = await run_turn(
                model=model,
                workbench=SandboxWorkbench(self.sandboxes, lease.sandbox_id, owner),
                recorder=StoreRecorder(self.store, sid),
                question=question.content,
                history=[HistoryMessage(m.role, m.content, m.internal) for m in history],
                limits=self.limits,
                sandbox_recreated=recreated,
                cancel=cancel,
            )
            skipped = await self._harvest(session, owner, lease, before)
            if result.status == "cancelled":
                # The loop abandoned its call; only ending the sandbox stops that code.
                await self._drop(sid, owner)
            if result.status == "done":
                status, message = "DONE", None
                if skipped:
                    message = "done; not saved: " + "; ".join(skipped)
            else:
                message = result.error.message if result.error else result.status
        except asyncio.CancelledError:
            reason = self.active[sid].stop_reason if sid in self.active else None
            if reason:
                with contextlib.suppress(SandbankError):
                    await self.store.set_status(sid, "ERROR", reason)
            self.active.pop(sid, None)
            raise
        except SandbankError as e:
            message = e.message
        except Exception:
            error_id = uuid.uuid4()
            log.exception("run of session %s failed, error id %s", sid, error_id)
            message = f"internal error; the server logged it with error id {error_id}"
        self.active.pop(sid, None)
        with contextlib.suppress(SessionNotFound):
            await self.store.set_status(sid, status, message)

    async def _lease(self, sid: str, owner: str, had_history: bool) -> tuple[Lease, bool]:
        lease = self.leases.get(sid)
        if lease is not None and await self.sandboxes.exists(lease.sandbox_id, owner):
            return lease, False
        # Earlier turns ran in a sandbox that is gone: its variables are lost.
        recreated = lease is not None or had_history
        lease = Lease(await self.sandboxes.create(owner), owner)
        self.leases[sid] = lease
        return lease, recreated

    async def _drop(self, sid: str, owner: str) -> None:
        lease = self.leases.pop(sid, None)
        if lease is not None:
            await self.sandboxes.destroy(lease.sandbox_id, owner)

    async def _place(self, sid: str, owner: str, lease: Lease) -> dict[str, tuple[int, float]]:
        """Put the session's files in the workspace; returns the workspace's files after."""
        present = await self._snapshot(lease, owner)
        placed_any = False
        for record in await self.files.list(sid):
            there = present.get(record.filename)
            # Code may have removed or (remotely) changed a file: its size tells.
            if lease.placed.get(record.filename) == record.updated_at and (
                there is not None and there[0] == record.size
            ):
                continue
            with tempfile.TemporaryDirectory(prefix="sandbank-place-") as tmp:
                path = Path(tmp) / "file"
                try:
                    await self.files.objects.copy_to(object_key(sid, record.filename), path)
                except NotFound:
                    log.warning("session %s: file %s has no object", sid, record.filename)
                    continue
                await self.sandboxes.put_file(
                    lease.sandbox_id, owner, record.filename, path, record.origin == "user"
                )
            lease.placed[record.filename] = record.updated_at
            placed_any = True
        return await self._snapshot(lease, owner) if placed_any else present

    async def _snapshot(self, lease: Lease, owner: str) -> dict[str, tuple[int, float]]:
        entries = await self.sandboxes.list_files(lease.sandbox_id, owner)
        return {e.path: (e.size, e.modified_at) for e in entries}

    async def _harvest(
        self, session: ChatSession, owner: str, lease: Lease, before: dict[str, tuple[int, float]]
    ) -> list[str]:
        """Save files the run created or changed; returns what was not saved, and why."""
        sid = session.id
        try:
            entries = await self.sandboxes.list_files(lease.sandbox_id, owner)
        except SessionNotFound:
            return []
        uploads = {r.filename for r in await self.store.list_files(sid) if r.origin == "user"}
        skipped: list[str] = []
        for entry in entries:
            if before.get(entry.path) == (entry.size, entry.modified_at):
                continue
            if entry.path in uploads:
                continue  # a user's upload is never replaced by a run (read-only anyway)
            try:
                await self._save(session, owner, lease, entry)
            except BadRequest:
                skipped.append(f"{entry.path} (name not allowed)")
            except (PayloadTooLarge, QuotaError) as e:
                skipped.append(f"{entry.path} ({e.message})")
            except SessionNotFound:
                break
        return skipped

    async def _save(self, session: ChatSession, owner: str, lease: Lease, entry: FileEntry) -> None:
        name = validate_stored_name(entry.path)
        remaining = await self.files.remaining_quota(session.user_id)
        existing = await self.store.get_file(session.id, name)
        if existing is not None:
            remaining += existing.size
        cap = min(self.settings.put_file_max_bytes, remaining)
        if entry.size > cap:
            raise QuotaError(
                "larger than the file size limit"
                if cap == self.settings.put_file_max_bytes
                else "storage quota reached"
            )
        with tempfile.TemporaryFile() as tmp:
            size = await self.sandboxes.read_file(lease.sandbox_id, owner, entry.path, tmp, cap)
            await anyio.to_thread.run_sync(tmp.seek, 0)
            await self.files.objects.put(object_key(session.id, name), tmp, size)
        record = await self.store.upsert_file(session.id, name, size, "assistant")
        lease.placed[name] = record.updated_at


class QuotaError(SandbankError):
    """A produced file not saved: too large, or past the user's storage quota."""
