"""Agent runs of sessions: leased jobs in the store, each a background task of the replica
holding it, on a leased sandbox, recorded in the store.

A run leases the session's sandbox (a new one when the provider reclaimed it, and the agent
is told), places the session's files in its workspace (uploads read-only), runs the agent
loop, then saves the files it created or changed as the session's `assistant` files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio
import anyio.to_thread

from sandbank.agent.interfaces import FileInfo, HistoryMessage
from sandbank.agent.loop import RunLimits, run_turn
from sandbank.agent.model import Model
from sandbank.agent.reach import ModelReach
from sandbank.agent.records import Role
from sandbank.config import Settings
from sandbank.errors import (
    AtCapacity,
    BadRequest,
    Conflict,
    LeaseLost,
    ModelUnreachable,
    NotFound,
    PayloadTooLarge,
    QuotaError,
    QuotaExceeded,
    RunInProgress,
    SandbankError,
    SessionNotFound,
    TooManyRuns,
)
from sandbank.files import object_key, validate_stored_name
from sandbank.interpreter.events import SessionEvents
from sandbank.interpreter.files import SessionFiles
from sandbank.protocol.calls import ExecResult, ToolCall
from sandbank.protocol.sessions import FileEntry
from sandbank.sandbox.port import Sandboxes, chunks_of, copy_out, exists, walk
from sandbank.store import ChatSession, Message, Run, RunState, SessionStatus, Store

log = logging.getLogger(__name__)

HANDED_BACK = "waiting for another server to continue"
WORKER_LOST = "the server working on this answer was lost too many times; ask again"
STOP_WAIT_S = 15.0  # how long stopping a run waits for it to record how it ended
MAX_ATTEMPTS = 3
STATE_READ_S = 1.0  # how long reading the state of a session's sandbox may take
# A run preferring the replica that holds its session's sandbox waits this many ticks for it
# before any replica may take it (that replica may be dead, or full).
AFFINITY_TICKS = 3  # claims of one run; a run that kills its replica must not kill them all
# What the model reads when it continues an answer that another replica began.
RESUME_NOTE = (
    "(The server that was working on your answer to the question above stopped. Continue "
    "answering it from where the work shown above left off. {sandbox})"
)
FRESH_SANDBOX = (
    "Your sandbox was started afresh: variables are gone, the session's files are in place."
)
KEPT_SANDBOX = (
    "Your sandbox was kept: its variables and files are as the work above left them, except "
    "what a tool result says was not restored."
)


# A chat's sandbox as its session shows it: `running`; `paused` (no process, its variables
# kept on disk: the next question resumes it); `none` (none yet, or it ended: the next question
# starts a fresh one).
SandboxState = Literal["running", "paused", "none"]


def new_replica_id() -> str:
    """This process's name in the runs table: random, so a restarted process is a new one."""
    return f"{socket.gethostname()[:40]}-{secrets.token_hex(6)}"


@dataclass
class Lease:
    """A session's sandbox, and which version of each session file is already in it."""

    sandbox_id: str
    owner: str
    placed: dict[str, float] = field(default_factory=dict)  # filename → record.updated_at
    network: str | None = None  # its egress policy, when this replica made it


@dataclass
class ActiveRun:
    run: Run
    task: asyncio.Task[None]
    cancel: anyio.Event
    # Set before the task is cancelled: the ERROR message to record, HANDED_BACK, or "" when
    # nothing may be written (the lease is lost, the session deleted).
    stop_reason: str | None = None
    finishing: bool = False  # the turn is over: it is saving files and recording its end


class StoreRecorder:
    """The agent's `Recorder`: messages and progress go to the session, while the lease holds,
    and the session's listeners here are told."""

    def __init__(
        self,
        store: Store,
        run: Run,
        events: SessionEvents,
        before_answer: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.run = run
        self.events = events
        # Files the run produced are saved before its answer is stored, so a client shown the
        # answer finds every file it names.
        self.before_answer = before_answer

    async def add_message(self, role: Role, content: str, internal: bool) -> None:
        if role == "assistant" and not internal and self.before_answer is not None:
            await self.before_answer()
        await self.store.runs.add_message(self.run, role, content, internal)
        self.events.changed(self.run.session_id)

    async def set_status(self, message: str) -> None:
        await self.store.runs.set_progress(self.run, message)
        self.events.changed(self.run.session_id)

    def text(self, step: int, delta: str) -> None:
        self.events.text(self.run.session_id, step, delta)


class SandboxWorkbench:
    """The agent's `Workbench`: one leased sandbox."""

    def __init__(self, sandboxes: Sandboxes, sandbox_id: str, owner: str) -> None:
        self.sandboxes = sandboxes
        self.sandbox_id = sandbox_id
        self.owner = owner

    async def execute(self, call: ToolCall, timeout_s: float) -> ExecResult:
        return await self.sandboxes.execute(self.sandbox_id, self.owner, call, timeout_s)

    async def list_files(self) -> list[FileInfo]:
        entries = await walk(self.sandboxes, self.sandbox_id, self.owner)
        return [FileInfo(e.path, e.size_bytes) for e in entries]


def answered(stored: list[Message], run: Run) -> bool:
    """Whether the run's final answer is among the session's stored messages."""
    return any(
        m.timestamp > run.question_at and m.role == "assistant" and not m.internal for m in stored
    )


def owner_of(user_id: str) -> str:
    return f"interp:{user_id}"


class Runs:
    """The runs of this replica: it claims runs from the store (its own posts at once, others'
    and orphans' on each tick), holds their leases while it works, and gives them back."""

    def __init__(
        self,
        store: Store,
        files: SessionFiles,
        sandboxes: Sandboxes,
        model: Model | SandbankError,
        settings: Settings,
        replica: str | None = None,
        on_ended: Callable[[str, int], None] | None = None,
        reach: ModelReach | None = None,
    ) -> None:
        self.store = store
        # Whether the model answers at all: a question is refused at once while it does not.
        self.reach = reach or ModelReach(settings, not isinstance(model, SandbankError))
        self.on_ended = on_ended  # (outcome, steps) of each run that ends here: metrics
        self.files = files
        self.sandboxes = sandboxes
        self.model = model  # the error that prevented building it, when not configured
        self.settings = settings
        self.replica = replica or new_replica_id()
        self.events = SessionEvents()
        self.limits = RunLimits.from_settings(settings)
        self.leases: dict[str, Lease] = {}
        self.active: dict[str, ActiveRun] = {}  # by session id
        self._claiming = True
        self._reserved = 0  # slots held by posts between their check and their store write
        self._wake = asyncio.Event()
        if settings.run_poll_seconds * 3 > settings.run_lease_seconds:
            log.warning(
                "SANDBANK_RUN_POLL_SECONDS (%g) is over a third of SANDBANK_RUN_LEASE_SECONDS "
                "(%g): a slow renewal may let another replica take a run that is still alive",
                settings.run_poll_seconds,
                settings.run_lease_seconds,
            )

    @property
    def shared_sandboxes(self) -> bool:
        """Every replica reaches the same sandboxes (one remote backend, or a fleet's nodes)."""
        return bool(self.settings.sandbox_url) or self.settings.role == "front"

    # --- starting, cancelling, stopping ------------------------------------------------------
    async def begin(self, session: ChatSession, content: str | None) -> Message:
        """Store the question and its run (taken here when there is room, else queued for any
        replica); refuses before storing anything. `content` None asks the session's latest
        question again, in place (no new message)."""
        if isinstance(self.model, SandbankError):
            # A fresh error each time: raising the stored one would grow its traceback
            # and keep every request's frames alive.
            raise type(self.model)(self.model.message)
        if self.reach.verdict.state == "unreachable":
            verdict = await self.reach.check()  # back since? one connection tells, in < 2 s
            if verdict.state == "unreachable":
                raise ModelUnreachable(verdict.message or "the model cannot be reached")
        s = self.settings
        # A slot is reserved across the await, so concurrent posts never overfill this replica.
        here = self._claiming and len(self.active) + self._reserved < s.runs_per_replica
        self._reserved += here
        try:
            started = await self.store.runs.start(
                session.id,
                content,
                max_per_user=s.max_runs_per_user,
                max_total=s.max_runs,
                owner=self.replica if here else None,
                lease_seconds=s.run_lease_seconds,
                # Local runtimes: the replica holding the session's sandbox runs it if alive.
                affinity=not self.shared_sandboxes,
            )
        finally:
            self._reserved -= here
        if started == "no_question":
            raise BadRequest("this session has no question to ask again: post one first")
        if started == "busy":
            raise RunInProgress(
                "a run is already in progress in this session: wait until its status is DONE "
                "or ERROR (or cancel it with POST /api/sessions/{id}/cancel), then post again"
            )
        if started == "user_limit":
            raise TooManyRuns(
                f"you have {s.max_runs_per_user} runs in progress, the most allowed at once: "
                "post again when one has ended"
            )
        if started == "total_limit":
            raise AtCapacity(
                f"the service is running {s.max_runs} agents, its limit: retry shortly",
                retry_after=10,
            )
        question, run = started
        if run.owner == self.replica:
            self._spawn(self.model, run)
        else:
            self._wake.set()
        return question

    async def cancel(self, session_id: str) -> None:
        """Cancel the session's run wherever it runs; returns once it ended (bounded)."""
        outcome = await self.store.runs.request_cancel(session_id)
        if outcome == "none":
            raise Conflict("no run is in progress in this session")
        if outcome == "ended":
            return
        local = self.active.get(session_id)
        if local is not None:
            local.cancel.set()
            await asyncio.wait({local.task}, timeout=STOP_WAIT_S)
            return
        # Another replica runs it: it reads the flag on its next tick.
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            session = await self.store.chats.get(session_id)
            if session is None or session.status != "PENDING":
                return
            await asyncio.sleep(0.1)

    async def stop(self, session_id: str, reason: str | None) -> None:
        """End the session's run here (its status set to ERROR `reason`, unless None) and its
        sandbox. A run on another replica loses its lease when its session is deleted."""
        active = self.active.get(session_id)
        if active is not None:
            active.stop_reason = reason or ""
            active.task.cancel()
            await asyncio.wait({active.task}, timeout=STOP_WAIT_S)
        lease = self.leases.pop(session_id, None)
        if lease is not None:
            with contextlib.suppress(SandbankError):
                await self.sandboxes.destroy(lease.sandbox_id, lease.owner)

    async def shutdown(self, grace_s: float | None = None) -> None:
        """Stop claiming; let running answers finish within the grace period, then hand the
        others back (queued, no lease) for another replica, or the next start, to continue."""
        self._claiming = False
        self._wake.set()
        grace = self.settings.shutdown_grace_seconds if grace_s is None else grace_s
        tasks = {a.task for a in self.active.values()}
        if tasks and grace > 0:
            await asyncio.wait(tasks, timeout=grace)
        remaining = list(self.active.values())
        for active in remaining:
            if not active.finishing:
                active.stop_reason = HANDED_BACK
                active.task.cancel()
        if remaining:
            await asyncio.wait({a.task for a in remaining}, timeout=STOP_WAIT_S)

    async def sandbox_states(
        self, user_id: str, chat_ids: Iterable[str]
    ) -> dict[str, SandboxState]:
        """The state of the sandbox of each of these chats of the user, by chat id; a chat left
        out is one whose sandbox this server cannot see (on another replica's machine, or the
        sandboxes cannot be listed now). Read from the sandboxes' listing, which neither
        resumes a sandbox nor counts as its activity (reading must not keep it from pausing
        when idle), and never makes one."""
        where = await self.store.chats.sandboxes_of(user_id)
        chats = {sid: where.get(sid) for sid in chat_ids}
        listed: dict[str, str] = {}
        if any(chats.values()):  # else there is nothing to look for
            try:
                # Bounded: a session's answer must not wait on a backend that does not answer.
                async with asyncio.timeout(STATE_READ_S):
                    found = await self.sandboxes.list_sessions(owner_of(user_id))
            except SandbankError as e:
                log.warning("the sandboxes could not be listed: %s", e.message)
                return {}
            except TimeoutError:
                log.warning("the sandboxes were not listed within %g s", STATE_READ_S)
                return {}
            listed = {i.id: i.state for i in found}
        states: dict[str, SandboxState] = {}
        for sid, held in chats.items():
            if held is not None and held[1] in listed:
                states[sid] = "paused" if listed[held[1]] == "paused" else "running"
            elif held is None or self.shared_sandboxes or held[0] == self.replica:
                states[sid] = "none"  # never had one, or this server would see it: it ended
        return states

    # --- the tick: renew, read cancels, claim -------------------------------------------------
    async def serve_forever(self) -> None:
        """Renew this replica's leases, pass on cancel requests, claim waiting runs; each tick."""
        while True:
            try:
                await self.tick()
            except SandbankError as e:
                log.error("runs: a tick failed: %s", e.message)
            except Exception:
                # The loop must outlive a bug: without it, this replica's leases would lapse.
                log.exception("runs: a tick failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.run_poll_seconds)

    async def tick(self) -> None:
        s = self.settings
        held = {a.run.id: a for a in self.active.values()}
        if held:
            renewed = await self.store.runs.renew(self.replica, list(held), s.run_lease_seconds)
            for run_id, active in held.items():
                if run_id not in renewed:
                    if not active.task.done() and active.stop_reason is None:
                        log.warning("run %s: lease lost, stopping it here", run_id)
                        active.stop_reason = ""
                        active.task.cancel()
                elif renewed[run_id]:
                    active.cancel.set()
        room = s.runs_per_replica - len(self.active) - self._reserved
        if self._claiming and room > 0 and not isinstance(self.model, SandbankError):
            claimed = await self.store.runs.claim(
                self.replica, room, s.run_lease_seconds, AFFINITY_TICKS * s.run_poll_seconds
            )
            for run in claimed:
                if run.attempts > 1:
                    log.info("run %s of session %s: taken over", run.id, run.session_id)
                self._spawn(self.model, run)

    def _spawn(self, model: Model, run: Run) -> None:
        cancel = anyio.Event()
        if run.cancel_requested:
            cancel.set()
        task = asyncio.create_task(self._run(model, run, cancel), name=f"run {run.id}")
        self.active[run.session_id] = ActiveRun(run, task, cancel)

    # --- one run -----------------------------------------------------------------------------
    async def _run(self, model: Model, run: Run, cancel: anyio.Event) -> None:
        sid, owner = run.session_id, owner_of(run.user_id)
        status: SessionStatus = "ERROR"
        state: RunState = "error"
        message: str | None = "internal error"
        steps = 0
        try:
            if run.attempts > MAX_ATTEMPTS:
                raise SandbankError(WORKER_LOST)
            stored = await self.store.chats.messages(sid)
            question = next((m for m in stored if m.timestamp == run.question_at), None)
            if question is None:
                raise LeaseLost(f"session {sid} is gone")
            resumed = run.attempts > 1
            if resumed and answered(stored, run):
                # The answer was stored before the last replica stopped; only the end was not.
                self._forget(run)
                await self.store.runs.finish(run, "DONE", None, "done")
                self.events.changed(sid)
                return
            # Resumed, the model sees the question and what another replica did, and goes on.
            history = stored if resumed else [m for m in stored if m.timestamp < run.question_at]
            lease, recreated = await self._lease(sid, owner, bool(history))
            before = await self._place(sid, owner, lease)
            saved: list[list[str]] = []  # what the harvest before the answer left unsaved

            async def save_files() -> None:
                self._finishing(run)
                saved.append(await self._harvest(run, owner, lease, before))

            result = await run_turn(
                model=model,
                workbench=SandboxWorkbench(self.sandboxes, lease.sandbox_id, owner),
                recorder=StoreRecorder(self.store, run, self.events, before_answer=save_files),
                question=RESUME_NOTE.format(sandbox=FRESH_SANDBOX if recreated else KEPT_SANDBOX)
                if resumed
                else question.content,
                history=[HistoryMessage(m.role, m.content, m.internal) for m in history],
                limits=self.limits,
                sandbox_recreated=recreated,
                cancel=cancel,
                network=lease.network or self.settings.egress_allow,
            )
            steps = result.steps
            if isinstance(result.error, LeaseLost):
                raise result.error
            if isinstance(result.error, ModelUnreachable):
                self.reach.failed()
            self._finishing(run)
            skipped = saved[0] if saved else await self._harvest(run, owner, lease, before)
            if result.status == "cancelled":
                # The loop abandoned its call; only ending the sandbox stops that code.
                await self._drop(sid, owner)
                state = "cancelled"
            if result.status == "done":
                status, state, message = "DONE", "done", None
                if skipped:
                    message = "done; not saved: " + "; ".join(skipped)
            else:
                message = result.error.message if result.error else result.status
        except asyncio.CancelledError:
            await self._stopped(run)
            raise
        except LeaseLost:
            log.warning("run %s: lease lost, its result is not recorded here", run.id)
            self._forget(run)
            with contextlib.suppress(SandbankError):
                await self._drop(sid, owner)
            return
        except SandbankError as e:
            message = e.message
        except Exception:
            error_id = uuid.uuid4()
            log.exception("run of session %s failed, error id %s", sid, error_id)
            message = f"internal error; the server logged it with error id {error_id}"
        self._forget(run)
        with contextlib.suppress(SandbankError):
            await self.store.runs.finish(run, status, message, state)
        self.events.changed(sid)
        if self.on_ended is not None:
            self.on_ended(state, steps)

    def _finishing(self, run: Run) -> None:
        """The turn is over: a shutdown lets it save its files and end."""
        active = self.active.get(run.session_id)
        if active is not None and active.run.id == run.id:
            active.finishing = True

    async def _stopped(self, run: Run) -> None:
        """The run's task was cancelled: record why, as `stop_reason` says."""
        active = self.active.get(run.session_id)
        reason = active.stop_reason if active is not None and active.run.id == run.id else None
        self._forget(run)
        with contextlib.suppress(SandbankError):
            if reason == HANDED_BACK:
                # Ends DONE instead when its answer is stored: an answer is never given twice.
                await self.store.runs.release(run, HANDED_BACK)
            elif reason:
                await self.store.runs.finish(run, "ERROR", reason, "error")
            elif reason == "":  # lost: its sandbox is of no use here any more
                await self._drop(run.session_id, owner_of(run.user_id))
        self.events.changed(run.session_id)

    def _forget(self, run: Run) -> None:
        active = self.active.get(run.session_id)
        if active is not None and active.run.id == run.id:
            del self.active[run.session_id]
            self._wake.set()  # a slot is free: claim a waiting run now, not at the next tick

    async def _lease(self, sid: str, owner: str, had_history: bool) -> tuple[Lease, bool]:
        lease = self.leases.get(sid)
        if lease is not None and await exists(self.sandboxes, lease.sandbox_id, owner):
            recorded = {r.filename for r in await self.files.list(sid)}
            if not set(lease.placed) - recorded:
                return lease, False
            # A file it holds was deleted: only a fresh sandbox is sure not to have it.
            await self._drop(sid, owner)
        if lease is None:
            # The sandbox this session used before is still there: a shared backend's (another
            # replica used it), or this server's own, paused when it stopped and found again at
            # its start, its variables kept (its files are placed again, as this process knows
            # nothing of what it holds). The first call says what the pause could not keep.
            _, stored = await self.store.chats.sandbox(sid)
            if stored is not None and await exists(self.sandboxes, stored, owner):
                lease = self.leases[sid] = Lease(stored, owner)
                await self.store.chats.note_sandbox(sid, self.replica, stored)
                return lease, False
        # Earlier turns ran in a sandbox that is gone: its variables are lost.
        recreated = lease is not None or had_history
        made = await self.sandboxes.create(owner)
        lease = Lease(made.id, owner, network=str(made.network))
        self.leases[sid] = lease
        await self.store.chats.note_sandbox(sid, self.replica, lease.sandbox_id)
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
                await self.sandboxes.write_file(
                    lease.sandbox_id,
                    owner,
                    record.filename,
                    chunks_of(path),
                    read_only=record.origin == "user",
                )
            lease.placed[record.filename] = record.updated_at
            placed_any = True
        return await self._snapshot(lease, owner) if placed_any else present

    async def _snapshot(self, lease: Lease, owner: str) -> dict[str, tuple[int, float]]:
        entries = await walk(self.sandboxes, lease.sandbox_id, owner)
        return {e.path: (e.size_bytes, e.modified_at) for e in entries}

    async def _harvest(
        self, run: Run, owner: str, lease: Lease, before: dict[str, tuple[int, float]]
    ) -> list[str]:
        """Save files the run created or changed; returns what was not saved, and why."""
        sid = run.session_id
        try:
            entries = await walk(self.sandboxes, lease.sandbox_id, owner)
        except SessionNotFound:
            return []
        uploads = {
            r.filename for r in await self.store.file_records.of_session(sid) if r.origin == "user"
        }
        skipped: list[str] = []
        for entry in entries:
            if before.get(entry.path) == (entry.size_bytes, entry.modified_at):
                continue
            if entry.path in uploads:
                continue  # a user's upload is never replaced by a run (read-only anyway)
            try:
                await self._save(run, owner, lease, entry)
            except BadRequest:
                skipped.append(f"{entry.path} (name not allowed)")
            except (PayloadTooLarge, QuotaError) as e:
                skipped.append(f"{entry.path} ({e.message})")
            except SessionNotFound:
                break
        return skipped

    async def _save(self, run: Run, owner: str, lease: Lease, entry: FileEntry) -> None:
        name = validate_stored_name(entry.path)
        cap = self.settings.put_file_max_bytes
        if entry.size_bytes > cap:
            raise QuotaError("larger than the file size limit")
        try:
            # Reserved before it is copied: files saved at once (this run's, other runs', a
            # user's uploads) never pass the storage quota together.
            async with self.files.reserving(run.session_id, name, entry.size_bytes, cap) as room:
                with tempfile.TemporaryFile() as tmp:
                    size = await copy_out(
                        self.sandboxes, lease.sandbox_id, owner, entry.path, tmp, cap
                    )
                    await room.ensure(size)  # it may have grown since it was listed
                    await anyio.to_thread.run_sync(tmp.seek, 0)
                    await self.files.objects.put(object_key(run.session_id, name), tmp, size)
                record = await room.commit(size, "assistant")
        except QuotaExceeded:
            raise QuotaError("storage quota reached") from None
        lease.placed[name] = record.updated_at
