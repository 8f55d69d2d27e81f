"""`IsolatedBackend`: what the isolated backends share, their sandboxes' slots of one host.

`fork`, `bwrap` and `gvisor` differ only in how a sandbox's worker starts; the uids, cgroups,
disks, seccomp program, trust store and egress proxy are slots of one `IsolatedHost` (shared
by every isolated backend a server offers). This is the wiring to it, written once; the
backends stay siblings over it: none imports another.
"""

from __future__ import annotations

from ...config import Settings
from ..host.machine import IsolatedHost
from .base import HOST_RESOURCES, INTERPRETERS, ISOLATION, LIMITS, RUNTIME, Backend


class IsolatedBackend(Backend):
    """A backend whose sandboxes each hold a slot of the shared isolated host."""

    # The slot gives every sandbox on it its own uid, namespaces, cgroups and disk, given back
    # at its end: whatever starts the worker, these are claimed for the same reason.
    claims = frozenset({RUNTIME, INTERPRETERS, ISOLATION, LIMITS, HOST_RESOURCES})

    def __init__(self, settings: Settings, host: IsolatedHost | None = None) -> None:
        super().__init__(settings)
        # `backends_for` passes the first isolated backend's host to the others.
        self.host = host or IsolatedHost(settings, self.instance, self.base_dir, self.limits)
        self.egress_proxy = self.host.egress_proxy

    def check(self) -> None:
        """The host's part (checked once however many backends share it); a backend adds its
        own tools before it."""
        self.host.check()

    async def prepare(self) -> None:
        await self.host.prepare()

    def sweep(self) -> None:
        self.host.sweep()

    async def close(self) -> None:
        await self.host.close()

    def memory(self) -> dict[str, int]:
        return {"sandboxes": self.host.memory()}

    def leftovers(self) -> dict[str, list[str]]:
        return {**super().leftovers(), **self.host.leftovers()}
