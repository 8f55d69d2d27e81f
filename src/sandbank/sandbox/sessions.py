"""Sessions: leased sandboxes with an owner, lifetimes, call ordering, capacity and reaping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field

from ..config import Settings
from ..egress.config import EgressConfig, build_proxy
from ..egress.policy import NetworkPolicy
from ..errors import AtCapacity, SessionNotFound
from .base import RC_TIMEOUT, ExecResult, ToolCall
from .channel import WorkerProcess
from .factory import SandboxFactory, become_subreaper, reap_orphans
from .managed import ManagedSandbox
from .pool import WarmPool

log = logging.getLogger(__name__)


@dataclass
class Session:
    id: str
    tenant: str
    sandbox: ManagedSandbox
    idle_timeout: int
    max_lifetime: int
    created_at: float = field(default_factory=time.time)
    last_activity_at: float = field(default_factory=time.time)
    inflight: int = 0
    network: NetworkPolicy = field(default_factory=NetworkPolicy)  # what its code may reach
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # FIFO: calls run in arrival order

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

    def __init__(self, settings: Settings, factory: SandboxFactory | None = None) -> None:
        self.settings = settings
        self.factory = factory or SandboxFactory(settings)
        self.egress = EgressConfig.from_settings(settings)
        self._install_egress_proxy()
        self.pool = WarmPool(self.factory, settings.pool_size, settings.pool_preimport)
        self._sessions: dict[str, Session] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._accepting = False

    def _install_egress_proxy(self) -> None:
        """Sandboxes get a way out only when the operator allows some network (README)."""
        if self.factory.isolated:
            self.factory.egress_proxy = build_proxy(self.settings, self.egress)
        elif self.egress.enabled:
            log.warning("egress policies are not enforced without isolation: code has the network")

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.factory.check()
        self.factory.prepare_dirs()
        if self.factory.isolated:
            become_subreaper()
        await self.factory.cleanup_stale()
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
        if self.factory.egress_proxy is not None:
            await self.factory.egress_proxy.close()
        self._reap_orphans()
        self.factory.release_instance()

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
    ) -> Session:
        """A new session; `network` is a client's hint, clamped to the operator's ceiling."""
        if not self._accepting:
            raise AtCapacity("the server is shutting down", retry_after=30)
        s = self.settings
        if len(self._sessions) >= s.max_sessions:
            self._reclaim_one()
        sandbox = await self.pool.take()
        session = Session(
            id=secrets.token_urlsafe(18),
            tenant=tenant,
            sandbox=sandbox,
            idle_timeout=self.clamp(idle_timeout, s.idle_timeout_default, s.idle_timeout_max),
            max_lifetime=self.clamp(max_lifetime, s.max_lifetime_default, s.max_lifetime_max),
            network=self.egress.effective(network),
        )
        if self.factory.egress_proxy is not None:
            self.factory.egress_proxy.lease(sandbox.id, session.id, session.network)
        self._sessions[session.id] = session
        return session

    def _reclaim_one(self) -> None:
        idle = [x for x in self._sessions.values() if x.inflight == 0 and not x.lock.locked()]
        if not idle:
            raise AtCapacity(
                f"all {self.settings.max_sessions} sessions are busy; retry shortly", retry_after=5
            )
        victim = min(idle, key=lambda x: x.last_activity_at)
        log.info("reclaiming least recently used session to make room")
        self._destroy_in_background(victim.id)

    def get(self, session_id: str, tenant: str) -> Session:
        session = self._sessions.get(session_id)
        # Another tenant's session does not exist for this caller.
        if session is None or not secrets.compare_digest(session.tenant, tenant):
            raise SessionNotFound(f"no session {session_id!r}")
        session.touch()
        return session

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    async def execute(
        self, session_id: str, tenant: str, call: ToolCall, timeout: float
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
                return await session.sandbox.execute(call, deadline)
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

    async def _close(self, session: Session) -> None:
        try:
            await session.sandbox.close()
        except Exception:
            log.exception("failed to remove a sandbox cleanly")
        self._reap_orphans()

    # --- reaping -------------------------------------------------------------------------
    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reaper_interval_seconds)
            self.reap()

    def reap(self) -> None:
        now = time.time()
        for session in list(self._sessions.values()):
            reason = session.expired(now)
            if reason:
                log.info("reclaiming a session: %s", reason)
                self._destroy_in_background(session.id)
        self._reap_orphans()

    def _reap_orphans(self) -> None:
        if self.factory.isolated:
            reap_orphans(WorkerProcess.spawned)

    def healthy(self) -> bool:
        return self._accepting
