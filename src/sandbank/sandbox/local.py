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
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from ..config import Settings
from ..egress.credentials import Credential, CredentialInfo, CredentialSet
from ..egress.vault import Vault
from ..errors import AtCapacity, Conflict, NotFound, SessionNotFound, TenantShareReached
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
from .backends import backend_for
from .backends.base import Backend
from .egress import CredentialBook, EgressConfig
from .host.tree import Tree
from .host.workspace import SANDBOX_ROOT, split
from .pool import WarmPool
from .sessions import ExecSession, TenantLimits, Watcher, victim
from .supervisor import DESTROYED, restore_root

log = logging.getLogger(__name__)
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
    "session {id!r} ended when the server restarted (sessions live in the server's memory "
    "and end with it): create a new session and run your code again"
)


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
    """Sessions on this machine's backend (`SANDBANK_ISOLATION`, or the one handed in)."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend | None = None,
        hooks: Hooks | None = None,
        tenants: int = 1,
    ) -> None:
        self.settings = settings
        self.tenant_limits = TenantLimits(settings, tenants)  # tenants: exec tokens configured
        self.backend = backend or backend_for(settings)
        self.hooks: Hooks = hooks or NoHooks()
        self.egress = EgressConfig.from_settings(settings)
        self.credentials = CredentialBook(settings)  # the operator's and the tenants'
        self.pool = WarmPool(self.backend, settings.pool_size, settings.pool_preimport)
        self._sessions: dict[str, ExecSession] = {}
        self._named: dict[tuple[str, str], str] = {}  # (tenant, name) -> session id
        self._closing: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._sweeping: asyncio.Future[None] | None = None
        self._sweep_again = False
        self._accepting = False
        self._stopping = False
        self.instance = secrets.token_hex(INSTANCE_CHARS // 2)

    def new_id(self) -> str:
        return self.instance + secrets.token_urlsafe(RANDOM_BYTES)

    def ended_with_a_restart(self, session_id: str) -> bool:
        """Whether the id is one of ours from an earlier run of the server (not this one's)."""
        head = session_id[:INSTANCE_CHARS]
        return len(session_id) == ID_CHARS and set(head) <= HEX and head != self.instance

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.credentials.load()
        self.backend.check()
        await self.backend.prepare()
        self.pool.start()
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
        for sid in list(self._sessions):
            self._destroy_in_background(sid)
        await self.pool.close()
        await self.drain()
        await self.backend.close()

    async def drain(self) -> None:
        """Wait until every destroy started so far has finished."""
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    def status(self) -> dict[str, int]:
        return {"pool_ready": self.pool.ready}

    def healthy(self) -> bool:
        return self._accepting

    # --- sessions ------------------------------------------------------------------------
    async def create(self, tenant: str, spec: SessionSpec | None = None) -> SessionInfo:
        """A new session; `spec.network` is a client's hint, clamped to the operator's ceiling.
        A named one that lives is given back instead."""
        spec = spec or SessionSpec()
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
                list(self._sessions.values()),
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
            log.info("reclaiming least recently used session to make room")
            self._destroy_in_background(reclaim.id)
        sandbox = await self.pool.take()
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
                    result = await session.sandbox.execute(call, deadline, on_event)
                finally:
                    session.lock.release()
        finally:
            session.inflight -= 1
            session.touch()
        if isinstance(call, PythonCall) and call.notebook:
            count = session.executions.get(call.context, 0) + 1
            session.executions[call.context] = result.execution_count = count
        if self._stopping and result.return_code == RC_KILLED:
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

    def _destroy_in_background(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        if self._named:
            for key in [k for k, v in self._named.items() if v == session_id]:
                del self._named[key]
        task = asyncio.create_task(self._close(session))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, session: ExecSession) -> None:
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
        await self.sweep()  # reap its orphaned processes now

    # --- files ---------------------------------------------------------------------------
    async def list_files(
        self, session_id: str, tenant: str, path: str, limit: int
    ) -> tuple[list[FileEntry], bool]:
        return await files.list_files(self.session(session_id, tenant), path, limit)

    async def read_file(self, session_id: str, tenant: str, path: str) -> Download:
        return await files.open_download(self.session(session_id, tenant), path)

    async def upload(
        self, session_id: str, tenant: str, form: AsyncIterator[FormPart], cap: int
    ) -> FileEntry:
        return await files.upload(self.session(session_id, tenant), form, cap)

    async def write_file(
        self,
        session_id: str,
        tenant: str,
        path: str,
        chunks: AsyncIterator[bytes],
        *,
        read_only: bool = False,
    ) -> FileEntry:
        session = self.session(session_id, tenant)
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
        session = self.session(session_id, tenant)
        _context(session, context_id)
        session.executions.pop(context_id, None)
        await session.sandbox.drop_context(context_id)

    async def remove_context(self, session_id: str, tenant: str, context_id: str) -> None:
        session = self.session(session_id, tenant)
        _context(session, context_id)
        del session.contexts[context_id]
        session.executions.pop(context_id, None)
        await session.sandbox.drop_context(context_id)

    # --- background processes ----------------------------------------------------------
    async def start_process(
        self, session_id: str, tenant: str, spec: ProcessSpec
    ) -> AsyncIterator[ProcessEvent]:
        session = self.session(session_id, tenant)
        if session.envs:
            spec = dataclasses.replace(spec, envs={**session.envs, **spec.envs})
        events = await session.sandbox.start_process(spec)
        async for event in events:
            session.touch()
            yield event

    async def connect_process(
        self, session_id: str, tenant: str, pid: int
    ) -> AsyncIterator[ProcessEvent]:
        session = self.session(session_id, tenant)
        async for event in await session.sandbox.connect_process(pid):
            session.touch()
            yield event

    async def list_processes(self, session_id: str, tenant: str) -> list[ProcessInfo]:
        return await self.session(session_id, tenant).sandbox.list_processes()

    async def send_stdin(self, session_id: str, tenant: str, pid: int, data: bytes) -> None:
        await self.session(session_id, tenant).sandbox.send_stdin(pid, data)

    async def close_stdin(self, session_id: str, tenant: str, pid: int) -> None:
        await self.session(session_id, tenant).sandbox.close_stdin(pid)

    async def signal_process(self, session_id: str, tenant: str, pid: int, sig: Signal) -> None:
        await self.session(session_id, tenant).sandbox.signal_process(pid, sig)

    # --- the workspace's tree ----------------------------------------------------------
    def _tree(self, session_id: str, tenant: str) -> Tree:
        sandbox = self.session(session_id, tenant).sandbox
        return Tree(sandbox.workspace, sandbox.uid, {0: "root", sandbox.uid: "user"})

    async def stat(self, session_id: str, tenant: str, path: str) -> FsEntry:
        return await asyncio.to_thread(self._tree(session_id, tenant).stat, path)

    async def list_tree(self, session_id: str, tenant: str, path: str, depth: int) -> list[FsEntry]:
        return await asyncio.to_thread(self._tree(session_id, tenant).walk, path, depth)

    async def make_dir(self, session_id: str, tenant: str, path: str) -> FsEntry:
        return await asyncio.to_thread(self._tree(session_id, tenant).make_dir, path)

    async def move(self, session_id: str, tenant: str, source: str, destination: str) -> FsEntry:
        tree = self._tree(session_id, tenant)
        return await asyncio.to_thread(tree.move, source, destination)

    async def remove(self, session_id: str, tenant: str, path: str) -> None:
        await asyncio.to_thread(self._tree(session_id, tenant).remove, path)

    async def watch(
        self, session_id: str, tenant: str, path: str, recursive: bool
    ) -> AsyncIterator[FsChange]:
        session = self.session(session_id, tenant)
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
            await asyncio.to_thread(self.backend.sweep)
            if not self._sweep_again:
                return


MAX_CONTEXTS = 32  # Python contexts per session
MAX_WATCHERS = 32  # polled watchers per session


def _context(session: ExecSession, context_id: str) -> ContextInfo:
    context = session.contexts.get(context_id)
    if context is None:
        raise NotFound(f"Context {context_id} not found")
    return context


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
    sandbox = session.sandbox
    # The unisolated development mode runs code as the server's own user: nothing to arrange.
    policy = (0, sandbox.uid, files.SHARED_ROOT_MODE)
    if sandbox.root_policy is not None and sandbox.root_policy != policy:
        sandbox.root_policy = policy
        await asyncio.to_thread(restore_root, sandbox.workspace, *policy)
