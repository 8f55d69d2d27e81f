"""Sessions: leased sandboxes with an owner, lifetimes, call ordering, capacity and reaping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field

from ..config import Settings
from ..egress.config import EgressConfig
from ..egress.policy import NetworkPolicy
from ..errors import AtCapacity, SessionNotFound
from .backend import Backend, Sandbox
from .base import RC_TIMEOUT, ExecResult, OnEvent, RestartReason, ToolCall
from .chooser import backend_for
from .pool import WarmPool
from .workspace import OpenFile

log = logging.getLogger(__name__)


@dataclass
class ExecSession:
    """A leased sandbox: its tenant, lifetimes, call ordering and open file transfers."""

    id: str
    tenant: str
    sandbox: Sandbox
    idle_timeout: int
    max_lifetime: int
    created_at: float = field(default_factory=time.time)
    last_activity_at: float = field(default_factory=time.time)
    inflight: int = 0
    network: NetworkPolicy = field(default_factory=NetworkPolicy)  # what its code may reach
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # FIFO: calls run in arrival order
    open_files: set[OpenFile] = field(default_factory=set)  # closed when the session goes

    def touch(self) -> None:
        self.last_activity_at = time.time()

    def expired(self, now: float) -> str | None:
        if now - self.created_at > self.max_lifetime:
            return "maximum lifetime reached"
        if self.inflight == 0 and now - self.last_activity_at > self.idle_timeout:
            return "idle timeout"
        return None


class Runtime:
    """The sandbox runtime as the HTTP layers see it. Nothing here knows about HTTP."""

    def __init__(self, settings: Settings, backend: Backend | None = None) -> None:
        self.settings = settings
        self.backend = backend or backend_for(settings)
        self.egress = EgressConfig.from_settings(settings)
        self.pool = WarmPool(self.backend, settings.pool_size, settings.pool_preimport)
        self._sessions: dict[str, ExecSession] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._sweeping: asyncio.Future[None] | None = None
        self._sweep_again = False
        self._accepting = False

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.backend.check()
        await self.backend.prepare()
        self.pool.start()
        self._reaper = asyncio.create_task(self._reap_forever())
        self._accepting = True

    async def shutdown(self) -> None:
        """Stop taking work, end running calls with a result, remove every sandbox."""
        self._accepting = False
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

    # --- sessions ------------------------------------------------------------------------
    def clamp(self, requested: int | None, default: int, ceiling: int) -> int:
        return min(requested or default, ceiling)

    async def create(
        self,
        tenant: str,
        idle_timeout: int | None = None,
        max_lifetime: int | None = None,
        network: NetworkPolicy | None = None,
    ) -> ExecSession:
        """A new session; `network` is a client's hint, clamped to the operator's ceiling."""
        if not self._accepting:
            raise AtCapacity("the server is shutting down", retry_after=30)
        s = self.settings
        self._make_room(tenant)
        sandbox = await self.pool.take()
        sandbox.on_restart = self.sandbox_restarted
        session = ExecSession(
            id=secrets.token_urlsafe(18),
            tenant=tenant,
            sandbox=sandbox,
            idle_timeout=self.clamp(idle_timeout, s.idle_timeout_default, s.idle_timeout_max),
            max_lifetime=self.clamp(max_lifetime, s.max_lifetime_default, s.max_lifetime_max),
            network=self.egress.effective(network),
        )
        if self.backend.egress_proxy is not None:
            self.backend.egress_proxy.lease(sandbox.id, session.id, session.network)
        self._sessions[session.id] = session
        return session

    def sandbox_restarted(self, reason: RestartReason) -> None:
        """A session's interpreter is being replaced (its state is lost, its files kept)."""
        log.info("a session's interpreter is restarted (%s)", reason)

    def _make_room(self, tenant: str) -> None:
        """Reclaim an idle session if needed, never below another tenant's fair share."""
        s = self.settings
        mine = [x for x in self._sessions.values() if x.tenant == tenant]
        cap = s.max_sessions_per_tenant or s.max_sessions
        if len(mine) >= cap:
            self._reclaim(mine, f"this client already has {cap} sessions, its most")
        elif len(self._sessions) >= s.max_sessions:
            counts = Counter(x.tenant for x in self._sessions.values())
            counts[tenant] += 1
            share = s.max_sessions / len(counts)
            # Tenants over their share give way, the caller first, then the largest one.
            over = sorted((t for t, n in counts.items() if n > share),
                          key=lambda t: (t != tenant, -counts[t]))  # fmt: skip
            for victim_tenant in over:
                theirs = [x for x in self._sessions.values() if x.tenant == victim_tenant]
                if self._reclaim(theirs, None):
                    return
            raise AtCapacity(
                f"all {s.max_sessions} sessions are busy; retry shortly", retry_after=5
            )

    def _reclaim(self, candidates: list[ExecSession], refusal: str | None) -> bool:
        idle = [x for x in candidates if x.inflight == 0 and not x.lock.locked()]
        if not idle:
            if refusal is not None:
                raise AtCapacity(f"{refusal}, all busy; retry shortly", retry_after=5)
            return False
        victim = min(idle, key=lambda x: x.last_activity_at)
        log.info("reclaiming least recently used session to make room")
        self._destroy_in_background(victim.id)
        return True

    def get(self, session_id: str, tenant: str) -> ExecSession:
        session = self._sessions.get(session_id)
        # Another tenant's session does not exist for this caller.
        if session is None or not secrets.compare_digest(session.tenant, tenant):
            raise SessionNotFound(f"no session {session_id!r}")
        session.touch()
        return session

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
        session = self.get(session_id, tenant)
        session.inflight += 1
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    await session.lock.acquire()
            except TimeoutError:
                return ExecResult(
                    stderr="[sandbank] timed out waiting for the session's earlier calls\n",
                    return_code=RC_TIMEOUT,
                    duration_ms=int((time.monotonic() - arrival) * 1000),
                )
            try:
                return await session.sandbox.execute(call, deadline, on_event)
            finally:
                session.lock.release()
        finally:
            session.inflight -= 1
            session.touch()

    async def destroy(self, session_id: str, tenant: str) -> None:
        session = self._sessions.get(session_id)
        if session is None or not secrets.compare_digest(session.tenant, tenant):
            return
        self._destroy_in_background(session_id)

    def _destroy_in_background(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        task = asyncio.create_task(self._close(session))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, session: ExecSession) -> None:
        # A client's open download or upload must not keep the workspace's disk busy.
        for open_file in list(session.open_files):
            open_file.close()
        try:
            await session.sandbox.close()
        except Exception:
            log.exception("failed to remove a sandbox cleanly; the sweep retries")
        await self.sweep()  # reap its orphaned processes now

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

    def healthy(self) -> bool:
        return self._accepting
