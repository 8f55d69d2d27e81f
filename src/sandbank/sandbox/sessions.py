"""Sessions on this machine: a leased sandbox with its tenant and lifetimes, and who gives way.

At `max_sessions`, an idle session is reclaimed, least recently used first, but only from a
tenant holding more than its fair share (`max_sessions` / tenants with sessions), the caller's
own first: one tenant's burst never takes another tenant's state away (503 instead).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from ..egress.policy import NetworkPolicy
from ..errors import AtCapacity
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
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # FIFO: calls run in arrival order
    open_files: set[OpenFile] = field(default_factory=set)  # closed when the session goes
    labels: dict[str, str] = field(default_factory=dict)  # a door's notes (E2B's metadata)
    envs: dict[str, str] = field(default_factory=dict)  # of every call and process
    contexts: dict[str, ContextInfo] = field(default_factory=dict)  # Python contexts by id
    executions: dict[str | None, int] = field(default_factory=dict)  # notebook calls, by context
    watchers: dict[str, Watcher] = field(default_factory=dict)  # watches polled by id

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

    def info(self) -> SessionInfo:
        return SessionInfo(
            id=self.id,
            idle_timeout=self.idle_timeout,
            max_lifetime=self.max_lifetime,
            created_at=self.created_at,
            last_activity_at=self.last_activity_at,
            network=self.network,
            labels=dict(self.labels),
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


def victim(
    sessions: list[ExecSession], tenant: str, max_sessions: int, per_tenant: int
) -> ExecSession | None:
    """The session to reclaim so `tenant` may have one more; None when there is room already.

    `AtCapacity` when room can only be made by taking a busy session or another tenant's fair
    share.
    """
    mine = [x for x in sessions if x.tenant == tenant]
    if len(mine) >= per_tenant:
        found = _least_recent(mine)
        if found is None:
            raise AtCapacity(
                f"this client already has {per_tenant} sessions, its most, all busy; retry shortly",
                retry_after=5,
            )
        return found
    if len(sessions) < max_sessions:
        return None
    counts = Counter(x.tenant for x in sessions)
    counts[tenant] += 1
    share = max_sessions / len(counts)
    # Tenants over their share give way, the caller first, then the largest one.
    over = sorted((t for t, n in counts.items() if n > share),
                  key=lambda t: (t != tenant, -counts[t]))  # fmt: skip
    for over_tenant in over:
        found = _least_recent([x for x in sessions if x.tenant == over_tenant])
        if found is not None:
            return found
    raise AtCapacity(f"all {max_sessions} sessions are busy; retry shortly", retry_after=5)


def _least_recent(candidates: list[ExecSession]) -> ExecSession | None:
    idle = [x for x in candidates if x.idle]
    return min(idle, key=lambda x: x.last_activity_at) if idle else None
