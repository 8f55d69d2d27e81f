"""The sandbox port on this machine: sessions over one backend and its warm pool.

Owns the sessions' lifetimes, call ordering, capacity and reaping; the backend makes the
sandboxes and holds their host resources. Nothing here knows about HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from ..config import Settings, forced_isolation, parse_tenant_isolation
from ..egress.credentials import Credential, CredentialInfo, CredentialSet
from ..egress.policy import NetworkPolicy
from ..egress.vault import Vault
from ..errors import (
    AtCapacity,
    Conflict,
    NotFound,
    PauseFailed,
    SandboxError,
    SessionNotFound,
    SnapshotDamaged,
    TenantShareReached,
    Unprocessable,
)
from ..protocol.calls import (
    RC_KILLED,
    RC_TIMEOUT,
    Display,
    Done,
    Event,
    ExecResult,
    OnEvent,
    Output,
    PythonCall,
    RestartReason,
    ToolCall,
)
from ..protocol.filesystem import FsChange, FsEntry
from ..protocol.processes import ContextInfo, ProcessEvent, ProcessInfo, ProcessSpec, Signal
from ..protocol.sessions import Download, FileEntry, FormPart, SessionInfo, SessionSpec
from . import files
from .backends import backends_for
from .backends.base import Backend
from .durability import CHECKPOINT, IN_WORKSPACE, PAUSED, STATE, Manifest, SnapshotStore, load_key
from .durability import CKPT_STATE as CHECKPOINT_STATE
from .egress import CredentialBook, EgressConfig
from .host.tree import Tree
from .host.workspace import SANDBOX_ROOT, split
from .inside import protocol
from .pool import WarmPool
from .sessions import ExecSession, TenantLimits, Watcher, victim
from .supervisor import DESTROYED, SupervisedSandbox, restore_root

log = logging.getLogger(__name__)
T = TypeVar("T")
# A session id: this server process's instance (hex, so an id never begins with `-`, which a
# command line would take for an option), then 144 random bits.
INSTANCE_CHARS = 6
RANDOM_BYTES = 18
ID_CHARS = INSTANCE_CHARS + RANDOM_BYTES * 4 // 3
HEX = frozenset("0123456789abcdef")
# What a call running when the server stops gets (its session ends with the server).
RESTARTING = (
    "[sandbank] the server is restarting: this session ended with it (its state is lost); "
    "retry in a new session\n"
)
ENDED_WITH_SERVER = (
    "session {id!r} ended when the server restarted, and no snapshot of it was kept (it was "
    "running when the server stopped without pausing it, and never checkpointed): create a "
    "new session and run your code again"
)
PAUSED_AT_STOP = (
    "[sandbank] the server is restarting: this call was interrupted, and the session paused "
    "with its state; its next call resumes it\n"
)
STATE_TIMEOUT = 120.0  # for a worker to write or load its state
NOT_DURABLE = "sessions cannot be paused on this server: its isolation ({name}) keeps no snapshots"


class Hooks(Protocol):
    """What is told of the local sandboxes as it happens (the metrics listen)."""

    def created(self) -> None: ...
    def refused(self) -> None: ...
    def executed(self, call: ToolCall, result: ExecResult, seconds: float) -> None: ...
    def destroyed(self) -> None: ...
    def restarted(self, reason: RestartReason) -> None: ...


class NoHooks:
    """Nobody listens."""

    def created(self) -> None:
        pass

    def refused(self) -> None:
        pass

    def executed(self, call: ToolCall, result: ExecResult, seconds: float) -> None:
        pass

    def destroyed(self) -> None:
        pass

    def restarted(self, reason: RestartReason) -> None:
        pass


class LocalSandboxes:
    """Sessions on this machine's backends: one per isolation offered (`SANDBANK_ISOLATION`
    and `SANDBANK_ISOLATION_CHOICES`), each with its warm pool; or the one handed in."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend | None = None,
        hooks: Hooks | None = None,
        tenants: int = 1,
        snapshot_key: Callable[[], bytes] | None = None,
    ) -> None:
        self.settings = settings
        self.tenant_limits = TenantLimits(settings, tenants)  # tenants: exec tokens configured
        self.tenant_isolation = parse_tenant_isolation(settings.tenant_isolation)
        made = [backend] if backend is not None else backends_for(settings)
        # By the isolation a client names; the default's first. A backend handed in (a fake)
        # stands for the configured isolation.
        offered = [settings.isolation] if backend is not None else settings.isolations()
        self.backends: dict[str, Backend] = dict(zip(offered, made, strict=True))
        self.backend = made[0]  # the default isolation's
        # Paused sessions resume on the durable backend offered (fork or bwrap), if any.
        self.durable: Backend | None = next((b for b in made if b.durable), None)
        self.hooks: Hooks = hooks or NoHooks()
        self.egress = EgressConfig.from_settings(settings)
        self.credentials = CredentialBook(settings)  # the operator's and the tenants'
        # The default isolation's pool is `pool_size`; another's is smaller (it is asked for
        # less often, and a gVisor sandbox waiting costs ~120 MiB).
        # Only the default's grows after bursts, into the room the sessions leave.
        self.pools = {
            name: WarmPool(
                b,
                settings.pool_size if b is self.backend else min(2, settings.pool_size),
                settings.pool_preimport,
                ceiling=settings.pool_size_max if b is self.backend else 0,
                room=self._pool_room,
            )
            for name, b in self.backends.items()
        }
        self.pool = self.pools[offered[0]]
        self._sessions: dict[str, ExecSession] = {}
        self._named: dict[tuple[str, str], str] = {}  # (tenant, name) -> session id
        self._closing: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._sweeping: asyncio.Future[None] | None = None
        self._sweep_again = False
        self._accepting = False
        self._stopping = False
        self.instance = secrets.token_hex(INSTANCE_CHARS // 2)
        self._snapshot_key = snapshot_key
        self.store: SnapshotStore | None = None  # paused sessions' snapshots (durable backends)
        self._damaged: dict[str, str] = {}  # snapshots refused at start: why
        self._background: set[asyncio.Task[None]] = set()  # pauses and checkpoints the reaper began
        # A fleet node's: a checkpoint is copied off the machine; a session ended for good
        # takes that copy with it (fleet/moves.py).
        self.on_checkpoint: Callable[[ExecSession], Awaitable[None]] | None = None
        self.on_ended: Callable[[ExecSession], Awaitable[None]] | None = None

    def _pool_room(self) -> int:
        """Sandboxes the machine may still start beside its sessions (the data disk and
        `max_sessions` were sized for the sessions and the pools' floors)."""
        held = len(self._sessions) + sum(p.ready for p in self.pools.values())
        floors = sum(p.floor for p in self.pools.values())
        return max(0, self.settings.max_sessions + floors - held)

    def new_id(self) -> str:
        return self.instance + secrets.token_urlsafe(RANDOM_BYTES)

    def ended_with_a_restart(self, session_id: str) -> bool:
        """Whether the id is one of ours from an earlier run of the server (not this one's)."""
        head = session_id[:INSTANCE_CHARS]
        return len(session_id) == ID_CHARS and set(head) <= HEX and head != self.instance

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.credentials.load()
        for backend in self.backends.values():
            backend.check()
        for backend in self.backends.values():
            await backend.prepare()
        if self.durable is not None:
            await asyncio.to_thread(self._open_store)
        for pool in self.pools.values():
            pool.start()
        self._reaper = asyncio.create_task(self._reap_forever())
        self._accepting = True

    async def close(self) -> None:
        """Stop taking work, end running calls with a result, remove every sandbox."""
        self._accepting = False
        self._stopping = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for task in list(self._background):
            task.cancel()
        if self.store is not None and self.settings.pause_on_shutdown:
            await self._pause_all()
        for sid, session in list(self._sessions.items()):
            # A paused session stays on disk for the next start.
            self._destroy_in_background(sid, forget=not session.paused)
        for pool in self.pools.values():
            await pool.close()
        await self.drain()
        for backend in reversed(list(self.backends.values())):
            await backend.close()

    async def drain(self) -> None:
        """Wait until every destroy started so far has finished."""
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    def status(self) -> dict[str, int]:
        return {"pool_ready": sum(pool.ready for pool in self.pools.values())}

    def healthy(self) -> bool:
        return self._accepting

    # --- sessions ------------------------------------------------------------------------
    async def create(self, tenant: str, spec: SessionSpec | None = None) -> SessionInfo:
        """A new session; `spec.network` is a client's hint, clamped to the operator's ceiling.
        A named one that lives is given back instead."""
        spec = spec or SessionSpec()
        spec = dataclasses.replace(spec, isolation=self.isolation_for(tenant, spec.isolation))
        key = None if spec.name is None else (tenant, spec.name)
        if key is not None and (named := self._live(key)) is not None:
            return named.info()
        try:
            session = await self._create(tenant, spec)
        except AtCapacity:
            self.hooks.refused()
            raise
        self.tenant_limits.served(tenant)
        self.hooks.created()
        if key is not None:
            if (raced := self._live(key)) is not None:  # made meanwhile: one session per name
                self._destroy_in_background(session.id)
                self.hooks.destroyed()
                return raced.info()
            self._named[key] = session.id
        return session.info()

    def isolation_for(self, tenant: str, asked: str | None) -> str:
        """The isolation a new session of `tenant` gets: the one its operator forces on it
        (`SANDBANK_TENANT_ISOLATION`), else the one asked for if offered, else the default.
        `Unprocessable` for a hint the server does not offer or the tenant may not have."""
        offered = list(self.backends)
        forced = forced_isolation(self.tenant_isolation, tenant, asked)
        if forced is not None:
            if forced not in self.backends:  # a backend handed in stands for one isolation
                raise Unprocessable(f"isolation {forced!r} is not offered here")
            return forced
        if asked is None:
            return offered[0]
        if asked not in self.backends:
            raise Unprocessable(
                f"isolation {asked!r} is not offered here: this server offers "
                f"{', '.join(repr(x) for x in offered)} (SANDBANK_ISOLATION, "
                "SANDBANK_ISOLATION_CHOICES); leave it out, or ask a server that runs it"
            )
        return asked

    def _live(self, key: tuple[str, str]) -> ExecSession | None:
        session_id = self._named.get(key)
        session = None if session_id is None else self._sessions.get(session_id)
        if session is None:
            self._named.pop(key, None)
            return None
        session.touch()
        return session

    async def _create(self, tenant: str, spec: SessionSpec) -> ExecSession:
        if not self._accepting:
            raise AtCapacity("the server is restarting: retry in a moment", retry_after=30)
        s = self.settings
        try:
            reclaim = victim(
                self._running_sessions(),
                tenant,
                s.max_sessions,
                self.tenant_limits.of(tenant),
                self.tenant_limits.waiting(time.time()),
            )
        except TenantShareReached:
            raise
        except AtCapacity:
            # Every session busy: this tenant waits, and tenants at their share give way to it.
            self.tenant_limits.refused(tenant, time.time())
            raise
        if reclaim is not None:
            self._reclaim(reclaim)
        assert spec.isolation is not None  # isolation_for
        sandbox = await self.pools[spec.isolation].take()
        sandbox.on_restart = self._restarted
        session = ExecSession(
            id=self.new_id(),
            tenant=tenant,
            sandbox=sandbox,
            idle_timeout=min(spec.idle_timeout or s.idle_timeout_default, s.idle_timeout_max),
            max_lifetime=min(spec.max_lifetime or s.max_lifetime_default, s.max_lifetime_max),
            network=self.egress.effective(spec.network),
            labels=dict(spec.labels),
            envs=dict(spec.envs),
            credentials=CredentialSet(spec.credentials),
            isolation=spec.isolation,
        )
        if self.backend.egress_proxy is not None:
            applicable = self.credentials.chain(tenant, session.credentials)
            self.backend.egress_proxy.lease(sandbox.id, session.id, session.network, applicable)
        self._sessions[session.id] = session
        return session

    def _restarted(self, reason: RestartReason) -> None:
        """A session's interpreter is being replaced (its state is lost, its files kept)."""
        log.info("a session's interpreter is restarted (%s)", reason)
        self.hooks.restarted(reason)

    def session(self, session_id: str, tenant: str) -> ExecSession:
        """The session, touched; `SessionNotFound` for an unknown one or another tenant's."""
        session = self._sessions.get(session_id)
        # Another tenant's session does not exist for this caller.
        if session is None or not secrets.compare_digest(session.tenant, tenant):
            if session is None and session_id in self._damaged:
                raise SnapshotDamaged(self._damaged[session_id])
            if session is None and self.ended_with_a_restart(session_id):
                raise SessionNotFound(ENDED_WITH_SERVER.format(id=session_id))
            raise SessionNotFound(f"no session {session_id!r}")
        if session.outlived(time.time()):  # past its lifetime: gone, even before the reaper
            self._destroy_in_background(session_id)
            raise SessionNotFound(f"no session {session_id!r}")
        session.touch()
        return session

    async def get(self, session_id: str, tenant: str) -> SessionInfo:
        return self.session(session_id, tenant).info()

    def sessions(self) -> list[ExecSession]:
        return list(self._sessions.values())

    async def execute(
        self,
        session_id: str,
        tenant: str,
        call: ToolCall,
        timeout: float,
        on_event: OnEvent | None = None,
    ) -> ExecResult:
        arrival = time.monotonic()
        deadline = arrival + timeout
        session = self.session(session_id, tenant)
        if isinstance(call, PythonCall):
            call = _in_context(session, call)
        session.inflight += 1
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    await session.lock.acquire()
            except TimeoutError:
                result = ExecResult(
                    stderr="[sandbank] timed out waiting for the session's earlier calls\n",
                    return_code=RC_TIMEOUT,
                    duration_ms=int((time.monotonic() - arrival) * 1000),
                )
            else:
                try:
                    if session.paused:
                        await self._resume_locked(session)
                    result = await session.sandbox.execute(call, deadline, on_event)
                finally:
                    session.lock.release()
        finally:
            session.inflight -= 1
            session.touch()
        if isinstance(call, PythonCall) and call.notebook:
            count = session.executions.get(call.context, 0) + 1
            session.executions[call.context] = result.execution_count = count
        if session.not_restored:  # the first call after a resume says what the pause lost
            result = _with_losses(result, session.not_restored)
            session.not_restored = {}
        if self._stopping and session.pausing and result.return_code != RC_KILLED:
            result = dataclasses.replace(result, stderr=result.stderr + PAUSED_AT_STOP)
        elif self._stopping and result.return_code == RC_KILLED:
            # Ended by the server's own stop, not by anything the code or client did.
            kept = result.stderr.replace(DESTROYED, "")
            result = dataclasses.replace(result, stderr=kept + RESTARTING)
        self.hooks.executed(call, result, time.monotonic() - arrival)
        return result

    async def stream(
        self,
        session_id: str,
        tenant: str,
        call: ToolCall,
        timeout: float,
        *,
        cancel_on_close: bool = False,
    ) -> AsyncIterator[Event]:
        self.session(session_id, tenant)  # an unknown session: raised at the first event
        queue: asyncio.Queue[Output | Display | None] = asyncio.Queue()
        running = asyncio.ensure_future(
            self.execute(session_id, tenant, call, timeout, queue.put_nowait)
        )
        running.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
            yield Done(running.result())
        finally:
            if cancel_on_close and not running.done():
                running.cancel()  # the sandbox interrupts the code and keeps the session in step

    async def destroy(self, session_id: str, tenant: str) -> None:
        session = self._sessions.get(session_id)
        if session is None or not secrets.compare_digest(session.tenant, tenant):
            return
        self._destroy_in_background(session_id)
        self.hooks.destroyed()

    def _destroy_in_background(self, session_id: str, forget: bool = True) -> None:
        """End the session; `forget`: its snapshot too (else it is kept for the next start)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        if self._named:
            for key in [k for k, v in self._named.items() if v == session_id]:
                del self._named[key]
        task = asyncio.create_task(self._close(session, forget))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        task.add_done_callback(self._room_made)

    def _room_made(self, _: object) -> None:
        for pool in self.pools.values():  # a grown pool held back for sessions may fill now
            pool.wake()

    async def _close(self, session: ExecSession, forget: bool = True) -> None:
        # A client's open download or upload must not keep the workspace's disk busy.
        for open_file in list(session.open_files):
            open_file.close()
        for watcher in session.watchers.values():
            if watcher.task is not None:
                watcher.task.cancel()
        try:
            await session.sandbox.close()
        except Exception:
            log.exception("failed to remove a sandbox cleanly; the sweep retries")
        if forget and self.store is not None:
            await asyncio.to_thread(self.store.remove, session.id)
        if forget and not session.moved and session.exported and self.on_ended is not None:
            try:
                await self.on_ended(session)
            except Exception:
                log.exception("an ended session's exported checkpoint could not be removed")
        await self.sweep()  # reap its orphaned processes now

    # --- files ---------------------------------------------------------------------------
    async def list_files(
        self, session_id: str, tenant: str, path: str, limit: int
    ) -> tuple[list[FileEntry], bool]:
        async with self._using(session_id, tenant) as session:
            return await files.list_files(session, path, limit)

    async def read_file(self, session_id: str, tenant: str, path: str) -> Download:
        async with self._using(session_id, tenant) as session:
            return await files.open_download(session, path)

    async def upload(
        self, session_id: str, tenant: str, form: AsyncIterator[FormPart], cap: int
    ) -> FileEntry:
        async with self._using(session_id, tenant) as session:
            return await files.upload(session, form, cap)

    async def write_file(
        self,
        session_id: str,
        tenant: str,
        path: str,
        chunks: AsyncIterator[bytes],
        *,
        read_only: bool = False,
    ) -> FileEntry:
        async with self._using(session_id, tenant) as session:
            if read_only:
                await _share_root(session)
            return await files.write_file(session, path, chunks, read_only)

    # --- sessions as a door lists and extends them ---------------------------------------
    async def list_sessions(self, tenant: str) -> list[SessionInfo]:
        now = time.time()
        mine = [
            s for s in self._sessions.values()
            if secrets.compare_digest(s.tenant, tenant) and not s.outlived(now)
        ]  # fmt: skip
        return [s.info() for s in sorted(mine, key=lambda s: s.created_at)]

    async def set_lifetime(self, session_id: str, tenant: str, seconds: int) -> SessionInfo:
        session = self.session(session_id, tenant)
        lived = time.time() - session.created_at
        wanted = math.ceil(lived + max(0, seconds))
        session.max_lifetime = max(1, min(wanted, self.settings.max_lifetime_max))
        return session.info()

    # --- the session's own credentials (the proxy reads them on each request) ------------
    async def list_credentials(self, session_id: str, tenant: str) -> list[CredentialInfo]:
        return [c.info() for c in self.session(session_id, tenant).credentials.listed()]

    async def remove_credential(self, session_id: str, tenant: str, credential_id: str) -> None:
        session = self.session(session_id, tenant)
        if not session.credentials.remove(credential_id):
            raise NotFound(f"no credential {credential_id[:80]!r} in this session")
        log.info("session %s: credential %s deleted", session_id[:14], credential_id[:80])

    async def replace_credentials(
        self, session_id: str, tenant: str, credentials: Sequence[Credential]
    ) -> list[CredentialInfo]:
        session = self.session(session_id, tenant)
        session.credentials.replace(credentials)
        return [c.info() for c in session.credentials.listed()]

    def _vault(self) -> Vault:
        if self.credentials.vault is None:
            raise Conflict(
                "this server stores no credentials: its operator has not set "
                "SANDBANK_CREDENTIALS_KEY (a session's own, given at CreateSession, still work)"
            )
        return self.credentials.vault

    async def store_credential(self, tenant: str, credential: Credential) -> CredentialInfo:
        vault = self._vault()
        stored = await asyncio.to_thread(vault.add, tenant, credential)
        return stored.info()

    async def list_stored_credentials(self, tenant: str) -> list[CredentialInfo]:
        return [c.info() for c in self._vault().list(tenant)]

    async def delete_stored_credential(self, tenant: str, credential_id: str) -> None:
        if not await asyncio.to_thread(self._vault().remove, tenant, credential_id):
            raise NotFound(f"no stored credential {credential_id[:80]!r}")

    # --- Python contexts ---------------------------------------------------------------
    async def create_context(
        self, session_id: str, tenant: str, cwd: str | None = None
    ) -> ContextInfo:
        session = self.session(session_id, tenant)
        if len(session.contexts) >= MAX_CONTEXTS:
            raise AtCapacity(f"a session has at most {MAX_CONTEXTS} contexts", retry_after=1)
        context = ContextInfo(str(uuid.uuid4()), cwd or SANDBOX_ROOT)
        session.contexts[context.id] = context
        return context

    async def list_contexts(self, session_id: str, tenant: str) -> list[ContextInfo]:
        return list(self.session(session_id, tenant).contexts.values())

    async def restart_context(self, session_id: str, tenant: str, context_id: str) -> None:
        session = await self.live(session_id, tenant)
        _context(session, context_id)
        session.executions.pop(context_id, None)
        await session.sandbox.drop_context(context_id)

    async def remove_context(self, session_id: str, tenant: str, context_id: str) -> None:
        session = await self.live(session_id, tenant)
        _context(session, context_id)
        del session.contexts[context_id]
        session.executions.pop(context_id, None)
        await session.sandbox.drop_context(context_id)

    # --- background processes ----------------------------------------------------------
    async def start_process(
        self, session_id: str, tenant: str, spec: ProcessSpec
    ) -> AsyncIterator[ProcessEvent]:
        session = await self.live(session_id, tenant)
        if session.envs:
            spec = dataclasses.replace(spec, envs={**session.envs, **spec.envs})
        events = await session.sandbox.start_process(spec)
        async for event in events:
            session.touch()
            yield event

    async def connect_process(
        self, session_id: str, tenant: str, pid: int
    ) -> AsyncIterator[ProcessEvent]:
        session = await self.live(session_id, tenant)
        async for event in await session.sandbox.connect_process(pid):
            session.touch()
            yield event

    async def list_processes(self, session_id: str, tenant: str) -> list[ProcessInfo]:
        return await (await self.live(session_id, tenant)).sandbox.list_processes()

    async def send_stdin(self, session_id: str, tenant: str, pid: int, data: bytes) -> None:
        await (await self.live(session_id, tenant)).sandbox.send_stdin(pid, data)

    async def close_stdin(self, session_id: str, tenant: str, pid: int) -> None:
        await (await self.live(session_id, tenant)).sandbox.close_stdin(pid)

    async def signal_process(self, session_id: str, tenant: str, pid: int, sig: Signal) -> None:
        await (await self.live(session_id, tenant)).sandbox.signal_process(pid, sig)

    # --- the workspace's tree ----------------------------------------------------------
    async def _on_tree(self, session_id: str, tenant: str, op: Callable[[Tree], T]) -> T:
        async with self._using(session_id, tenant) as session:
            sandbox = session.sandbox
            tree = Tree(sandbox.workspace, sandbox.uid, {0: "root", sandbox.uid: "user"})
            return await asyncio.to_thread(op, tree)

    async def stat(self, session_id: str, tenant: str, path: str) -> FsEntry:
        return await self._on_tree(session_id, tenant, lambda t: t.stat(path))

    async def list_tree(self, session_id: str, tenant: str, path: str, depth: int) -> list[FsEntry]:
        return await self._on_tree(session_id, tenant, lambda t: t.walk(path, depth))

    async def make_dir(self, session_id: str, tenant: str, path: str) -> FsEntry:
        return await self._on_tree(session_id, tenant, lambda t: t.make_dir(path))

    async def move(self, session_id: str, tenant: str, source: str, destination: str) -> FsEntry:
        return await self._on_tree(session_id, tenant, lambda t: t.move(source, destination))

    async def remove(self, session_id: str, tenant: str, path: str) -> None:
        await self._on_tree(session_id, tenant, lambda t: t.remove(path))

    async def watch(
        self, session_id: str, tenant: str, path: str, recursive: bool
    ) -> AsyncIterator[FsChange]:
        session = await self.live(session_id, tenant)
        return await session.sandbox.watch("/".join(split(path)) or ".", recursive)

    async def create_watcher(self, session_id: str, tenant: str, path: str, recursive: bool) -> str:
        session = self.session(session_id, tenant)
        if len(session.watchers) >= MAX_WATCHERS:
            raise AtCapacity(f"a session has at most {MAX_WATCHERS} watchers", retry_after=1)
        changes = await self.watch(session_id, tenant, path, recursive)
        watcher = Watcher()

        async def collect() -> None:
            async for change in changes:
                watcher.add(change)

        watcher.task = asyncio.create_task(collect())
        watcher_id = secrets.token_urlsafe(12)
        session.watchers[watcher_id] = watcher
        return watcher_id

    async def watcher_changes(
        self, session_id: str, tenant: str, watcher_id: str
    ) -> list[FsChange]:
        watcher = self.session(session_id, tenant).watchers.get(watcher_id)
        if watcher is None:
            raise NotFound(f"watcher {watcher_id!r} not found")
        changes, watcher.pending = watcher.pending, []
        return changes

    async def remove_watcher(self, session_id: str, tenant: str, watcher_id: str) -> None:
        watcher = self.session(session_id, tenant).watchers.pop(watcher_id, None)
        if watcher is not None and watcher.task is not None:
            watcher.task.cancel()

    # --- pauses: a session's processes end, its state kept on disk (durability.py) -------
    def _open_store(self) -> None:
        """The snapshots of earlier runs: their sessions are known again, paused."""
        root = self.settings.data_dir.resolve() / "paused"
        if self._snapshot_key is not None:
            key = self._snapshot_key()
        else:
            self.settings.data_dir.mkdir(parents=True, exist_ok=True)
            key = load_key(self.settings.data_dir / "snapshots.key")
        store = self.store = SnapshotStore(root, key)
        store.prepare()
        for entry in root.iterdir():
            if not (entry / "manifest.json").exists():
                # Running when the server stopped, never checkpointed: nothing to resume.
                log.info("a session that ended with the server left no snapshot: removed")
                store.remove(entry.name)
        for session_id in store.scan():
            try:
                manifest = store.load(session_id)
                if manifest.kind == CHECKPOINT:
                    manifest = _checkpoint_becomes_pause(store, manifest)
            except SnapshotDamaged as e:
                log.warning("%s", e.message)
                self._damaged[session_id] = e.message
                continue
            self._sessions[session_id] = self._paused_session(manifest)
        if self._sessions:
            log.info(
                "%d paused sessions found again, resumed on their next call", len(self._sessions)
            )

    def _paused_session(self, manifest: Manifest) -> ExecSession:
        assert self.store is not None
        image = self.store.disk(manifest.session_id)
        return ExecSession(
            id=manifest.session_id,
            tenant=manifest.tenant,
            sandbox=self._durable().resumed(image, manifest.uid),
            idle_timeout=manifest.idle_timeout,
            max_lifetime=manifest.max_lifetime,
            created_at=manifest.created_at,
            last_activity_at=manifest.last_activity_at,
            network=self.egress.effective(
                NetworkPolicy()
                if manifest.network is None
                else NetworkPolicy.parse(manifest.network)
            ),
            labels=dict(manifest.labels),
            envs=dict(manifest.envs),
            paused=True,
            paused_at=manifest.saved_at,
            shared_root=manifest.shared_root,
            isolation=self._durable().name,  # only a durable backend's snapshots are kept
            origin=manifest.origin,
        )

    def adopt(self, manifest: Manifest) -> ExecSession:
        """A paused session whose snapshot was just committed to the store (moved here from
        another node): known from now on, resumed on its next call."""
        self._durable_store()
        session = self._sessions[manifest.session_id] = self._paused_session(manifest)
        return session

    async def pause_all(self) -> None:
        """Pause every running session now (a fleet node's drain, before moving them)."""
        self._durable_store()
        await self._pause_all()

    def forget(self, session_id: str) -> None:
        """End a paused session and its local snapshot: it continues elsewhere (moved)."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.moved = True
        self._destroy_in_background(session_id)

    def _durable_store(self) -> SnapshotStore:
        if self.store is None:
            raise Conflict(NOT_DURABLE.format(name=self.backend.name))
        return self.store

    def _durable(self) -> Backend:
        assert self.durable is not None, "only a durable backend's sessions are paused"
        return self.durable

    def _backend_of(self, session: ExecSession) -> Backend:
        return self.backends.get(session.isolation) or self.backend

    def _pausable(self, session: ExecSession) -> bool:
        """Its backend keeps snapshots (a gVisor session is never resumed on another)."""
        return self.store is not None and self._backend_of(session).durable

    async def live(self, session_id: str, tenant: str) -> ExecSession:
        """The session, running: a paused one is resumed first (in turn with its calls)."""
        session = self.session(session_id, tenant)
        if session.paused or session.pausing:
            async with session.lock:
                if session.paused:
                    await self._resume_locked(session)
        return session

    @contextlib.asynccontextmanager
    async def _using(self, session_id: str, tenant: str) -> AsyncIterator[ExecSession]:
        """The session, running, its workspace in use until the block ends (a pause waits)."""
        session = await self.live(session_id, tenant)
        session.file_ops += 1
        try:
            yield session
        finally:
            session.file_ops -= 1

    async def pause(self, session_id: str, tenant: str) -> SessionInfo:
        """Pause the session (after the calls before it); `PauseFailed` or `StorageFull`, and
        the session running as before, when its state cannot be kept."""
        self._durable_store()
        session = self.session(session_id, tenant)
        if not self._pausable(session):
            raise Conflict(NOT_DURABLE.format(name=session.isolation))
        await self._pause(session)
        return session.info()

    async def resume(self, session_id: str, tenant: str) -> SessionInfo:
        return (await self.live(session_id, tenant)).info()

    async def _pause(self, session: ExecSession, kind: str = PAUSED) -> None:
        session.pausing = True
        try:
            async with session.lock:
                if session.paused or self._sessions.get(session.id) is not session:
                    return
                if kind == CHECKPOINT:
                    await self._checkpoint_locked(session)
                else:
                    await self._pause_locked(session)
        finally:
            session.pausing = False

    async def _save_state(self, session: ExecSession, name: str) -> tuple[dict[str, str], str, int]:
        """The worker writes its state; the store takes it: (what was lost, digest, size)."""
        store = self._durable_store()
        sandbox = _supervised(session)
        try:
            lost = await sandbox.state_op(protocol.OP_SAVE, IN_WORKSPACE, STATE_TIMEOUT)
        except SandboxError as e:
            raise PauseFailed(
                f"the session's state could not be saved ({e.message}): it keeps running"
            ) from None
        digest, size = await asyncio.to_thread(
            store.take_state, session.id, sandbox.workspace, name
        )
        return lost, digest, size

    async def _pause_locked(self, session: ExecSession) -> None:
        store = self._durable_store()
        # Its workspace is about to be unmounted: the file operations begun before wait.
        deadline = time.monotonic() + STATE_TIMEOUT
        while session.file_ops and time.monotonic() < deadline:  # noqa: ASYNC110 - rare, short
            await asyncio.sleep(0.01)
        if session.file_ops:
            raise PauseFailed("a file operation on the session did not end: it keeps running")
        lost, digest, size = await self._save_state(session, STATE)
        # From here its processes end: transfers and watches end with them.
        for open_file in list(session.open_files):
            open_file.close()
        for watcher_id, watcher in session.watchers.items():
            if watcher.task is not None:
                watcher.task.cancel()
            lost[f"watcher {watcher_id}"] = "watches end with a pause"
        session.watchers.clear()
        sandbox = _supervised(session)
        uid, image = sandbox.uid, store.disk(session.id)
        try:
            await sandbox.suspend(image)
        except Exception as e:
            log.exception("a session's disk could not be kept at its pause: the session ends")
            self._destroy_in_background(session.id)
            raise PauseFailed(f"the session could not be paused and has ended: {e}") from None
        manifest = self._manifest(session, PAUSED, uid, digest, size, lost)
        session.sandbox = self._durable().resumed(image, uid)
        session.paused, session.paused_at = True, time.time()
        try:
            await asyncio.to_thread(store.commit, manifest)
            await asyncio.to_thread(store.forget_checkpoint, session.id)
        except Exception:
            # Still resumable by this server (its files are there); only a restart loses it.
            log.exception("a paused session's manifest could not be written")
        self._bound_paused()

    async def _checkpoint_locked(self, session: ExecSession) -> None:
        store = self._durable_store()
        activity = session.last_activity_at
        lost, digest, size = await self._save_state(session, CHECKPOINT_STATE)
        sandbox = _supervised(session)
        try:
            await sandbox.checkpoint_disk(store.disk(session.id, "checkpoint.img"))
        except OSError as e:
            raise PauseFailed(f"the session's disk could not be copied: {e}") from None
        manifest = self._manifest(session, CHECKPOINT, sandbox.uid, digest, size, lost)
        await asyncio.to_thread(store.commit, manifest)
        session.checkpointed_at = activity
        if self.on_checkpoint is not None:
            # Under the session's lock: the checkpoint's files stay as committed meanwhile.
            try:
                await self.on_checkpoint(session)
            except Exception:
                log.exception("a checkpoint could not be copied to the object store")

    def _manifest(
        self, session: ExecSession, kind: str, uid: int, digest: str, size: int,
        lost: dict[str, str],
    ) -> Manifest:  # fmt: skip
        return Manifest(
            session_id=session.id,
            tenant=session.tenant,
            kind=kind,
            uid=uid,
            idle_timeout=session.idle_timeout,
            max_lifetime=session.max_lifetime,
            created_at=session.created_at,
            last_activity_at=session.last_activity_at,
            network=None if session.network.is_none else session.network.entries(),
            labels=dict(session.labels),
            envs=dict(session.envs),
            state_sha256=digest,
            state_bytes=size,
            lost=lost,
            shared_root=session.shared_root,
            origin=session.origin,
        )

    async def _resume_locked(self, session: ExecSession) -> None:
        """Start a sandbox on the paused session's disk and have its worker load its state."""
        store = self._durable_store()
        if self._stopping:  # it stays paused for the next start
            raise AtCapacity("the server is restarting: retry in a moment", retry_after=30)
        if self._sessions.get(session.id) is not session:  # ended while this call waited
            raise SessionNotFound(f"no session {session.id!r}")
        try:
            manifest = await asyncio.to_thread(store.load, session.id)
        except (SnapshotDamaged, FileNotFoundError) as e:
            self._destroy_in_background(session.id)
            if isinstance(e, SnapshotDamaged):
                raise
            raise SnapshotDamaged(
                f"the snapshot of session {session.id!r} is missing: it was not restored"
            ) from None
        self._make_room(session)
        sandbox = _supervised(session)
        sandbox.on_restart = self._restarted
        try:
            await sandbox.start()
        except BaseException:
            # Its disk is still kept: a later call tries again.
            session.sandbox = self._durable().resumed(store.disk(session.id), manifest.uid)
            raise
        try:
            await asyncio.to_thread(store.place_state, manifest, sandbox.workspace, sandbox.uid)
            lost = await sandbox.state_op(protocol.OP_RESTORE, IN_WORKSPACE, STATE_TIMEOUT)
        except SnapshotDamaged:
            self._destroy_in_background(session.id)  # never half restored
            raise
        except BaseException:
            # Its snapshot is untouched (the disk is kept where it was, the state in the
            # store): the session stays paused for a later call to try again.
            await asyncio.shield(sandbox.close())
            session.sandbox = self._durable().resumed(store.disk(session.id), sandbox.uid)
            raise
        if self.backend.egress_proxy is not None:
            applicable = self.credentials.chain(session.tenant, session.credentials)
            self.backend.egress_proxy.lease(sandbox.id, session.id, session.network, applicable)
        await asyncio.to_thread(store.forget_manifest, session.id)
        if session.shared_root:  # its read-only files stay so in the new sandbox
            await _share_root(session)
        session.paused = False
        session.not_restored = lost

    def _running_sessions(self) -> list[ExecSession]:
        """The sessions that count against `max_sessions` (one being paused does not)."""
        return [s for s in self._sessions.values() if not (s.paused or s.pausing)]

    def _make_room(self, resuming: ExecSession) -> None:
        """A resume counts against `max_sessions` as a new session does."""
        running = [s for s in self._running_sessions() if s is not resuming]
        reclaim = victim(
            running, resuming.tenant, self.settings.max_sessions,
            self.tenant_limits.of(resuming.tenant), self.tenant_limits.waiting(time.time()),
        )  # fmt: skip
        if reclaim is not None:
            self._reclaim(reclaim)

    def _reclaim(self, session: ExecSession) -> None:
        """Make room: pause the least recently used idle session (or end it, when it cannot be
        paused)."""
        if self._pausable(session) and session.idle_for_pause:
            log.info("pausing the least recently used session to make room")
            session.pausing = True  # counted out at once; its pause runs in the background
            self._in_background(self._pause_reclaimed(session))
            return
        log.info("reclaiming least recently used session to make room")
        self._destroy_in_background(session.id)

    async def _pause_reclaimed(self, session: ExecSession) -> None:
        try:
            await self._pause(session)
        except Exception as e:  # noqa: BLE001 - the room is needed: it ends instead
            log.warning("a session could not be paused to make room (%s): it ends", e)
            self._destroy_in_background(session.id)

    def _in_background(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _pause_quietly(self, session: ExecSession, kind: str) -> None:
        try:
            await self._pause(session, kind)
        except Exception as e:  # noqa: BLE001 - the reaper tries again later
            log.warning(
                "an idle session could not be %s: %s",
                f"{kind}ed" if kind == CHECKPOINT else "paused",
                e,
            )

    async def _pause_all(self) -> None:
        """At a stop: pause every running session within the shutdown grace; a call running
        is interrupted first (its state survives a KeyboardInterrupt, and the pause)."""
        idle = [s for s in self._running_sessions() if not s.open_files and self._pausable(s)]
        if not idle:
            return
        started = time.monotonic()
        tasks = [asyncio.create_task(self._pause_quietly(s, PAUSED)) for s in idle]
        await asyncio.sleep(0)  # each pause marks its session before the calls end
        for session in idle:
            if session.lock.locked():
                _supervised(session).interrupt()
        _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_seconds or None)
        for task in pending:
            task.cancel()
        paused = sum(1 for s in idle if s.paused)
        log.info(
            "paused %d of %d idle sessions in %.2f s; the next start resumes them",
            paused, len(idle), time.monotonic() - started,
        )  # fmt: skip

    def _bound_paused(self) -> None:
        paused = sorted((s for s in self._sessions.values() if s.paused), key=lambda s: s.paused_at)
        for session in paused[: max(0, len(paused) - self.settings.max_paused_sessions)]:
            log.info("ending the session paused longest ago (SANDBANK_MAX_PAUSED_SESSIONS)")
            self._destroy_in_background(session.id)

    def hibernate(self, now: float) -> None:
        """Pause (or checkpoint) the sessions idle long enough, in the background."""
        s = self.settings
        if self.store is None or not (
            s.pause_after_idle_seconds or s.checkpoint_after_idle_seconds
        ):
            return
        for session in self._running_sessions():
            if not session.idle_for_pause or not self._pausable(session):
                continue
            idle = now - session.last_activity_at
            if s.pause_after_idle_seconds and idle >= s.pause_after_idle_seconds:
                self._in_background(self._pause_quietly(session, PAUSED))
            elif (
                s.checkpoint_after_idle_seconds
                and idle >= s.checkpoint_after_idle_seconds
                and session.checkpointed_at != session.last_activity_at
            ):
                self._in_background(self._pause_quietly(session, CHECKPOINT))

    # --- reaping -------------------------------------------------------------------------
    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reaper_interval_seconds)
            self.reap()
            try:
                await self.sweep()
            except Exception:
                log.exception("the sweep for leftovers failed; the next one retries")

    def reap(self, now: float | None = None) -> None:
        """Destroy the sessions expired at `now` (default: the current time)."""
        now = time.time() if now is None else now
        for session in list(self._sessions.values()):
            reason = session.expired(now)
            if reason:
                log.info("reclaiming a session: %s", reason)
                self._destroy_in_background(session.id)
        self.hibernate(now)

    async def sweep(self) -> None:
        """The backend's sweep for leftovers, off the event loop, one at a time.

        It reads /proc and the mount table, which grow with the sessions: a burst of destroys
        shares sweeps rather than running one each. A caller returns after a sweep that started
        after its call.
        """
        if self._sweeping is not None and not self._sweeping.done():
            self._sweep_again = True
        else:
            self._sweeping = asyncio.ensure_future(self._sweep_until_quiet())
        await asyncio.shield(self._sweeping)

    async def _sweep_until_quiet(self) -> None:
        while True:
            self._sweep_again = False
            for backend in self.backends.values():
                await asyncio.to_thread(backend.sweep)
            if not self._sweep_again:
                return


MAX_CONTEXTS = 32  # Python contexts per session
MAX_WATCHERS = 32  # polled watchers per session


def _context(session: ExecSession, context_id: str) -> ContextInfo:
    context = session.contexts.get(context_id)
    if context is None:
        raise NotFound(f"Context {context_id} not found")
    return context


def _supervised(session: ExecSession) -> SupervisedSandbox:
    sandbox = session.sandbox
    assert isinstance(sandbox, SupervisedSandbox), "durable backends run supervised sandboxes"
    return sandbox


def _with_losses(result: ExecResult, lost: dict[str, str]) -> ExecResult:
    """The result, saying what the pause before it could not keep (stderr and a field)."""
    named = "; ".join(f"{name} ({why})" for name, why in sorted(lost.items()))
    line = f"[sandbank] this session was paused and resumed; not restored: {named}\n"
    return dataclasses.replace(result, stderr=line + result.stderr, not_restored=dict(lost))


def _checkpoint_becomes_pause(store: SnapshotStore, manifest: Manifest) -> Manifest:
    """After a crash, a checkpoint is the snapshot to resume from."""
    d = store.dir(manifest.session_id)
    os.replace(d / "checkpoint.img", d / "disk.img")
    os.replace(d / CHECKPOINT_STATE, d / STATE)
    manifest = dataclasses.replace(manifest, kind=PAUSED)
    store.commit(manifest)
    return manifest


def _in_context(session: ExecSession, call: PythonCall) -> PythonCall:
    """The call with its context's directory and the session's environment variables."""
    cwd = None if call.context is None else _context(session, call.context).cwd
    envs = {**session.envs, **(call.envs or {})} if session.envs or call.envs else None
    if cwd is None and envs is None:
        return call
    return dataclasses.replace(call, cwd=cwd, envs=envs)


async def _share_root(session: ExecSession) -> None:
    """The workspace root becomes the server's, writable by the sandbox's group and sticky, so
    files placed read-only cannot be renamed or deleted by the session's code."""
    session.shared_root = True
    sandbox = session.sandbox
    # The unisolated development mode runs code as the server's own user: nothing to arrange.
    policy = (0, sandbox.uid, files.SHARED_ROOT_MODE)
    if sandbox.root_policy is not None and sandbox.root_policy != policy:
        sandbox.root_policy = policy
        await asyncio.to_thread(restore_root, sandbox.workspace, *policy)
