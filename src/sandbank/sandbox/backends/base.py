"""The backend interface: what the local sandboxes need of one sandbox and of a way to make them.

Backends, siblings over the host resources of `sandbox/host`: `fork` (isolated, forked from a
warm template; the default), `bwrap` (isolated, a fresh exec each), `gvisor` (a gVisor container
each: user code on gVisor's kernel, not the host's), `none` (the unisolated
development mode), `fake` (in-process, for tests that need no root); `backend_for` picks one by
`SANDBANK_ISOLATION`. The three isolated ones share their wiring to the host
(`isolated.IsolatedBackend`) and differ only in how a worker starts. A backend declares the
properties it claims (`claims`), and the contract suite in tests/sandbox runs every test of a
property against every backend that claims it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import ClassVar, Protocol

from ...config import Settings
from ...egress.proxy import EgressProxy
from ...protocol.calls import ExecResult, OnEvent, RestartReason, ToolCall
from ...protocol.filesystem import FsChange
from ...protocol.processes import ProcessEvent, ProcessInfo, ProcessSpec, Signal
from ..limits import limits_from

# Properties a backend can claim (each one a part of the contract suite):
RUNTIME = "runtime"  # sessions: capacity, tenants, lifetimes, call ordering
INTERPRETERS = "interpreters"  # a real persistent Python and bash, the editor, timeouts, crashes
ISOLATION = "isolation"  # namespaces, seccomp, its own uid, nothing of the host visible
LIMITS = "limits"  # memory, processes, CPU, disk, open files enforced
HOST_RESOURCES = "host-resources"  # cgroups, loop disks and uids, all given back


class Sandbox(Protocol):
    """One sandbox, as the runtime uses it."""

    id: str
    # The workspace root's (uid, gid, mode), given back before every start (None: leave it).
    root_policy: tuple[int, int, int] | None
    # Told when the interpreter is replaced after a timeout kill, a crash or a memory kill.
    on_restart: Callable[[RestartReason], None] | None

    @property
    def uid(self) -> int:
        """Who owns the workspace's files (0: the server's own user)."""
        ...

    @property
    def workspace(self) -> Path:
        """The workspace as the server reaches it, for its own file operations."""
        ...

    @property
    def closed(self) -> bool: ...

    async def start(self) -> None: ...

    async def execute(
        self, call: ToolCall, deadline: float, on_event: OnEvent | None = None
    ) -> ExecResult:
        """Run one call by `deadline` (monotonic); a program's failure is a result.

        With `on_event`, its output (and display bundles) is handed over as it is produced.
        """
        ...

    async def close(self) -> None:
        """Kill everything and give back every host resource; a running call gets a result."""
        ...

    # Beside calls (while one runs too): background processes, watches, Python contexts.
    async def start_process(self, spec: ProcessSpec) -> AsyncIterator[ProcessEvent]:
        """Start a process; its events (`Started` first). Dropping them stops nothing."""
        ...

    async def connect_process(self, pid: int) -> AsyncIterator[ProcessEvent]:
        """A running process's events from now on (`Started` first); `NotFound` for none."""
        ...

    async def list_processes(self) -> list[ProcessInfo]: ...

    async def send_stdin(self, pid: int, data: bytes) -> None: ...

    async def close_stdin(self, pid: int) -> None: ...

    async def signal_process(self, pid: int, sig: Signal) -> None:
        """Signal the process's whole group."""
        ...

    async def watch(self, path: str, recursive: bool) -> AsyncIterator[FsChange]:
        """Changes under a workspace directory (a relative path), once the watch is in place."""
        ...

    async def drop_context(self, context: str) -> None:
        """Forget a Python context's namespace."""
        ...


class Backend(ABC):
    """A way to make sandboxes, and the host resources this server's sandboxes hold."""

    name: ClassVar[str]
    claims: ClassVar[frozenset[str]]
    egress_proxy: EgressProxy | None = None  # how its sandboxes reach the network, if at all
    durable: ClassVar[bool] = False  # its sessions can be paused (durability.py)

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base_dir = (settings.data_dir / "sandboxes").resolve()
        self.instance = instance_id(settings.data_dir)
        self.limits = limits_from(settings)
        self.runtime_dir = settings.runtime_dir.resolve()

    def check(self) -> None:  # noqa: B027 - most backends need nothing of the machine
        """Raise `IsolationUnavailable` with what to do when this backend cannot run here."""

    async def prepare(self) -> None:
        """Create the directories, and remove what a crashed run of this data dir left."""
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for child in self.base_dir.iterdir():
            shutil.rmtree(child, ignore_errors=True)

    @abstractmethod
    def new(self, preimport: bool) -> Sandbox:
        """A sandbox, not started yet."""

    def resumed(self, image: Path, previous_uid: int) -> Sandbox:
        """A sandbox, not started yet, on a paused session's kept disk (durable backends)."""
        raise NotImplementedError(f"{self.name} sandboxes cannot be paused")

    def sweep(self) -> None:  # noqa: B027 - nothing outlives a fake's sandbox
        """Periodically: reap orphans, retry removing what a closed sandbox could not give back."""

    async def close(self) -> None:  # noqa: B027
        """At shutdown, after every sandbox is closed."""

    def memory(self) -> dict[str, int]:
        """What its sandboxes hold, in bytes, by part (`sandboxes`, `template`), for metrics."""
        return {}

    def leftovers(self) -> dict[str, list[str]]:
        """Host resources this server still holds (for leak tests and the soak benchmark)."""
        dirs = sorted(p.name for p in self.base_dir.iterdir()) if self.base_dir.exists() else []
        return {"dirs": dirs}


def instance_id(data_dir: Path) -> str:
    """Stable per data directory, so a restart finds what a crashed run of it left behind."""
    return "i" + hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


def new_sandbox_id() -> str:
    return "s" + os.urandom(8).hex()
