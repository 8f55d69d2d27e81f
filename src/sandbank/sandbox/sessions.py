"""Sessions on this machine: a leased sandbox with its tenant and lifetimes, and who gives way.

Each tenant may hold up to its limit (`TenantLimits`): by default, on a server with several
tenants, three quarters of `max_sessions`, so one tenant keeping every session busy never
keeps the others out. While another tenant waits (it was refused for lack of room not long
ago), a tenant at its fair share (`max_sessions` / tenants holding or waiting) gets no more:
what frees up goes to those waiting. At `max_sessions`, an idle session is reclaimed, least
recently used first, but only from a tenant holding more than its fair share, the caller's own
first: one tenant's burst never takes another tenant's state away (503 instead). Each refusal
names the limit it hit.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from ..config import Settings, parse_tenant_limits
from ..egress.credentials import CredentialSet
from ..egress.policy import NetworkPolicy
from ..errors import AtCapacity, TenantShareReached
from ..protocol.filesystem import FsChange
from ..protocol.processes import ContextInfo
from ..protocol.sessions import SessionInfo
from .backends.base import Sandbox
from .host.workspace import OpenFile


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
    credentials: CredentialSet = field(default_factory=CredentialSet)  # its own (the proxy adds)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # FIFO: calls run in arrival order
    open_files: set[OpenFile] = field(default_factory=set)  # closed when the session goes
    labels: dict[str, str] = field(default_factory=dict)  # a door's notes (E2B's metadata)
    envs: dict[str, str] = field(default_factory=dict)  # of every call and process
    contexts: dict[str, ContextInfo] = field(default_factory=dict)  # Python contexts by id
    executions: dict[str | None, int] = field(default_factory=dict)  # notebook calls, by context
    watchers: dict[str, Watcher] = field(default_factory=dict)  # watches polled by id
    paused: bool = False  # no process: its state is in its snapshot (durability.py)
    pausing: bool = False  # a pause holds its lock: file operations wait for it
    file_ops: int = 0  # file operations on its workspace now (a pause waits for them)
    shared_root: bool = False  # files were placed read-only (local._share_root)
    not_restored: dict[str, str] = field(default_factory=dict)  # told in the next call's result
    checkpointed_at: float = 0.0  # last_activity_at as of its last checkpoint
    paused_at: float = 0.0
    isolation: str = ""  # what its sandbox runs under (the server's SANDBANK_ISOLATION)
    origin: str = ""  # moved from another fleet node: the key it moves under (fleet/moves.py)
    exported: bool = False  # a checkpoint of it is in the fleet's object store
    moved: bool = False  # it continues on another node: what was exported stays

    def touch(self) -> None:
        self.last_activity_at = time.time()

    def expired(self, now: float) -> str | None:
        if self.outlived(now):
            return "maximum lifetime reached"
        if self.inflight == 0 and now - self.last_activity_at > self.idle_timeout:
            return "idle timeout"
        return None

    def outlived(self, now: float) -> bool:
        return now - self.created_at > self.max_lifetime

    @property
    def idle(self) -> bool:
        return self.inflight == 0 and not self.lock.locked()

    @property
    def idle_for_pause(self) -> bool:
        """Idle, running, and with no transfer open (a pause unmounts its workspace)."""
        return self.idle and not self.paused and not self.open_files and not self.pausing

    def info(self) -> SessionInfo:
        return SessionInfo(
            id=self.id,
            idle_timeout=self.idle_timeout,
            max_lifetime=self.max_lifetime,
            created_at=self.created_at,
            last_activity_at=self.last_activity_at,
            network=self.network,
            labels=dict(self.labels),
            credentials=tuple(c.info() for c in self.credentials.listed()),
            state="paused" if self.paused else "running",
            isolation=self.isolation,
        )


@dataclass(eq=False)
class Watcher:
    """A watch whose changes wait to be polled (at most MAX_PENDING; the rest are dropped)."""

    task: asyncio.Task[None] | None = None
    pending: list[FsChange] = field(default_factory=list)
    dropped: int = 0

    MAX_PENDING = 10000

    def add(self, change: FsChange) -> None:
        if len(self.pending) < self.MAX_PENDING:
            self.pending.append(change)
        else:
            self.dropped += 1


# How long a tenant refused for lack of room counts as waiting (its clients retry sooner).
WAITING_SECONDS = 60.0


class TenantLimits:
    """The sessions each tenant may hold: `tenant_max_sessions` for the tenants it names,
    else `max_sessions_per_tenant`, else (several tenants configured) three quarters of
    `max_sessions`, else all of them."""

    def __init__(self, settings: Settings, tenants: int) -> None:
        self.max_sessions = settings.max_sessions
        if settings.max_sessions_per_tenant:
            self.default = min(settings.max_sessions_per_tenant, self.max_sessions)
            self.source = "SANDBANK_MAX_SESSIONS_PER_TENANT"
        elif tenants >= 2:
            self.default = max(1, self.max_sessions - max(1, self.max_sessions // 4))
            self.source = f"three quarters of the server's {self.max_sessions}"
        else:
            self.default = self.max_sessions
            self.source = "SANDBANK_MAX_SESSIONS"
        self.overrides = parse_tenant_limits(settings.tenant_max_sessions)
        self._waiting: dict[str, float] = {}  # tenant: until when it counts as waiting

    def of(self, tenant: str) -> tuple[int, str]:
        """(the tenant's limit, where it comes from)."""
        for prefix, limit in self.overrides.items():
            if tenant.startswith(prefix):
                return limit, "SANDBANK_TENANT_MAX_SESSIONS"
        return self.default, self.source

    def refused(self, tenant: str, now: float) -> None:
        self._waiting[tenant] = now + WAITING_SECONDS

    def served(self, tenant: str) -> None:
        self._waiting.pop(tenant, None)

    def waiting(self, now: float) -> set[str]:
        self._waiting = {t: until for t, until in self._waiting.items() if until > now}
        return set(self._waiting)


def victim(
    sessions: list[ExecSession],
    tenant: str,
    max_sessions: int,
    limit: tuple[int, str],
    waiting: AbstractSet[str] = frozenset(),
) -> ExecSession | None:
    """The session to reclaim so `tenant` may have one more; None when there is room already.

    `TenantShareReached` when the tenant is at its limit (or at its fair share while others
    wait) with every session busy; `AtCapacity` when room can only be made by taking a busy
    session or another tenant's fair share.
    """
    per_tenant, source = limit
    mine = [x for x in sessions if x.tenant == tenant]
    if len(mine) >= per_tenant:
        found = _least_recent(mine)
        if found is None:
            raise TenantShareReached(
                f"this client holds {len(mine)} sessions, the most it may hold ({per_tenant}: "
                f"{source}), all busy; end one or retry shortly",
                retry_after=5,
            )
        return found
    counts = Counter(x.tenant for x in sessions)
    counts[tenant] += 1
    others_waiting = waiting - {tenant}
    share = max_sessions / len(set(counts) | others_waiting)
    if others_waiting and len(mine) >= share:
        found = _least_recent(mine)  # trading one of its own for a new one takes nothing
        if found is None:
            raise TenantShareReached(
                f"this client holds {len(mine)} sessions, its fair share of the server's "
                f"{max_sessions} while other clients wait, all busy; end one or retry shortly",
                retry_after=5,
            )
        return found
    if len(sessions) < max_sessions:
        return None
    # Tenants over their share give way, the caller first, then the largest one.
    over = sorted((t for t, n in counts.items() if n > share),
                  key=lambda t: (t != tenant, -counts[t]))  # fmt: skip
    for over_tenant in over:
        found = _least_recent([x for x in sessions if x.tenant == over_tenant])
        if found is not None:
            return found
    raise AtCapacity(
        f"all {max_sessions} sessions of this server are busy (SANDBANK_MAX_SESSIONS); "
        "retry shortly",
        retry_after=5,
    )


def _least_recent(candidates: list[ExecSession]) -> ExecSession | None:
    idle = [x for x in candidates if x.idle]
    return min(idle, key=lambda x: x.last_activity_at) if idle else None
