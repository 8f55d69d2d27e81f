"""The host resources a server's isolated sandboxes hold together, whichever backend starts them.

Uids, the instance's cgroups, the sandboxes' directories and disks, the seccomp program and the
egress proxy: checked before start, prepared at start (what a crashed run of this data directory
left is removed), swept while serving, given back at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import time
from pathlib import Path

from ... import capacity
from ...config import Settings
from ...egress.proxy import EgressProxy
from ...errors import IsolationUnavailable, SandboxError
from ..channel import WorkerProcess
from ..egress import EgressConfig, build_proxy
from ..limits import Limits
from . import cgroups, disk, trust
from .layout import HOST_PATH
from .seccomp import build_filter
from .slot import Slot, remove_sandbox_dir
from .uids import UidAllocator, lock_file

log = logging.getLogger(__name__)
PR_SET_CHILD_SUBREAPER = 36
# Groups of an instance that holds no lock (a server from before instance locks) are left
# alone unless empty and this old: such a server may still be running.
UNLOCKED_INSTANCE_AGE = 3600.0
# What a sandbox leaves orphaned to us: bwrap's inner init, the fork template's, gVisor's.
# (runsc re-executes itself as the Sentry, the gofer and the ptrace stubs: "exe".)
ORPHAN_NAMES = (b"(bwrap", b"(sb-init", b"(runsc-sandbox", b"(runsc-gofer", b"(exe")
INSTANCE_LOCK_WAIT = 30.0  # a sweeper holds another instance's lock for a few seconds at most


class InstanceLock:
    """This server's claim on its instance's cgroups, machine-wide: an exclusive `flock` on
    `<uid_lock_dir>/instances/<instance>` held for the server's life. Another server's start
    sweeps every instance whose lock nobody holds (a killed server's); the kernel drops a
    dead server's lock."""

    def __init__(self, lock_dir: Path, instance: str) -> None:
        self.dir = lock_dir / "instances"
        self.instance = instance
        self._fd: int | None = None

    def acquire(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        deadline = time.monotonic() + INSTANCE_LOCK_WAIT
        while (fd := lock_file(self.dir / self.instance, create=True)) is None:
            if time.monotonic() > deadline:
                raise IsolationUnavailable(
                    f"the cgroups of this data directory ({self.instance}) are held by another "
                    f"process ({self.dir / self.instance} is locked)"
                )
            time.sleep(0.05)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def sweep_others(self) -> None:
        """Remove the cgroups of every other instance that no live server holds."""
        for other in sorted(cgroups.instances() - {self.instance}):
            path = self.dir / other
            if not path.exists():
                removed = cgroups.remove_empty_groups(other, time.time() - UNLOCKED_INSTANCE_AGE)
                if removed:
                    log.info("removed %d empty cgroups of an instance without a lock", removed)
                continue
            fd = lock_file(path, create=False)
            if fd is None:
                continue  # a live server's
            try:
                removed = cgroups.remove_instance(other)
                path.unlink()
                log.info("removed %d cgroups a stopped server (%s) left", removed, other)
            except OSError as e:
                log.warning("the cgroups a stopped server (%s) left are not removed: %s", other, e)
            finally:
                os.close(fd)


def check_tools(tools: tuple[tuple[str, str], ...], otherwise: str) -> None:
    """The host tools (and their Debian packages), cgroups and root an isolated backend needs."""
    for tool, package in tools:
        if shutil.which(tool, path=HOST_PATH) is None:
            raise IsolationUnavailable(
                f"{tool} is not installed: `apt-get install {package}` (or run with {otherwise})"
            )
    cgroups.check_available()
    if os.geteuid() != 0:
        raise IsolationUnavailable(
            "the isolated runtime must start as root (it creates cgroups, loop mounts and "
            "drops each sandbox to its own uid)"
        )


def favor_dynamic_moves() -> None:
    """Ask for cheap cgroup moves (cgroups.favor_dynamic_moves); a refusal only costs speed."""
    try:
        state = cgroups.favor_dynamic_moves()
    except OSError as e:
        log.warning(
            "cgroup2 favordynmods could not be enabled (%s): each sandbox start waits ~10 ms "
            "more to join its cgroup",
            e,
        )
        return
    if state == "enabled":
        log.info("remounted cgroup2 with favordynmods: sandboxes join their cgroups faster")


class IsolatedHost:
    """This server's isolated sandboxes' share of the machine.

    One per server, shared by every isolated backend it offers (`SANDBANK_ISOLATION_CHOICES`):
    their sandboxes draw on the same uids, cgroups, directory and disk, and a sweep must know
    all of them. Checked once; prepared by the first backend and closed by the last.
    """

    def __init__(self, settings: Settings, instance: str, base_dir: Path, limits: Limits) -> None:
        self.settings = settings
        self.instance = instance
        self.base_dir = base_dir
        self.limits = limits
        self.runtime_dir = settings.runtime_dir.resolve()
        self.uids: UidAllocator | None = None
        self.seccomp = b""
        self.trust_store: Path | None = None  # bound at /etc/ssl/certs in every sandbox
        # Sandboxes get a way out only when the operator allows some network (README).
        self.egress_proxy: EgressProxy | None = build_proxy(
            settings, EgressConfig.from_settings(settings)
        )
        self._open: set[str] = set()  # sandboxes made and not yet given back
        self._own_store = False
        self._checked = False
        self._users = 0  # backends prepared on it and not closed yet
        self.instance_lock = InstanceLock(settings.uid_lock_dir, instance)

    def check(self) -> None:
        """The runtime, traversable paths, the seccomp program and the uid pool."""
        if self._checked:
            return
        python = self.runtime_dir / "bin" / "python3"
        if not python.exists():
            raise IsolationUnavailable(
                f"the sandbox runtime is missing at {self.runtime_dir}: run `make install` "
                "or set SANDBANK_RUNTIME_DIR"
            )
        # Sandbox uids must reach the runtime and their workspaces under the data directory.
        data = self.settings.data_dir.resolve()
        for target in (self.runtime_dir, data):
            for parent in (p for p in [target, *target.parents] if p.exists()):
                if parent.stat().st_mode & 0o001 == 0 and parent != data:
                    raise IsolationUnavailable(
                        f"{parent} is not traversable by other users, so sandbox users cannot "
                        f"reach {target}: move it or `chmod o+x {parent}`"
                    )
        self.seccomp = build_filter()
        # The sandboxes' CA bundle, with the deployment CA of credentials when there is egress.
        roots = self.egress_proxy.roots() if self.egress_proxy is not None else []
        self.trust_store = trust.prepare(self.settings, roots)
        # A store holding this deployment's CA is this data directory's alone (one server per
        # data directory): unmounted at close; a restart after a kill mounts the same again.
        self._own_store = bool(roots)
        s = self.settings
        self.uids = UidAllocator(s.uid_lock_dir, s.uid_base, s.uid_count)
        self._checked = True

    async def prepare(self) -> None:
        self._users += 1
        if self._users > 1:
            return
        data = self.settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        # Sandbox uids must traverse these to reach their own workspace (mode 0700 inside).
        os.chmod(data, os.stat(data).st_mode | 0o111)  # noqa: S103 - traverse only, no listing
        os.chmod(self.base_dir, 0o711)  # noqa: S103 - traverse only, no listing
        # Orphans of sandboxes (bwrap's inner init) are reparented to us instead of PID 1.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if self.settings.cgroup_favor_dynmods:
            await asyncio.to_thread(favor_dynamic_moves)
        await asyncio.to_thread(self._cleanup_stale)
        await asyncio.to_thread(self._sweep_machine)
        sandboxes = self.settings.max_sessions + self.settings.pool_size_max
        soft, want = capacity.raise_open_files(sandboxes)
        if soft < want:
            log.warning(
                "open files are limited to %d; %d sandboxes want %d (raise the hard limit, "
                "`ulimit -Hn`, or lower SANDBANK_MAX_SESSIONS)",
                soft, sandboxes, want,
            )  # fmt: skip
        # Sessions are counted by their idle cost (capacity.py); together they stay below this.
        cgroups.limit_instance(self.instance, capacity.sessions_memory())

    def slot(
        self,
        sandbox_id: str,
        formatted_disk: Path | None = None,
        kept_disk: tuple[Path, int] | None = None,
        limits: Limits | None = None,
    ) -> Slot:
        """A sandbox's share; `limits` when its backend's differ (gVisor's kernel needs room)."""
        assert self.uids is not None, "check() first"
        self._open.add(sandbox_id)
        return Slot(
            sandbox_id,
            instance=self.instance,
            base_dir=self.base_dir,
            uids=self.uids,
            limits=limits or self.limits,
            egress_proxy=self.egress_proxy,
            formatted_disk=formatted_disk,
            kept_disk=kept_disk,
            on_released=self._open.discard,
        )

    def _sweep_machine(self) -> None:
        """What killed servers left on the machine: other instances' cgroups that no live
        server holds, and uid lock files nobody holds."""
        self.instance_lock.sweep_others()
        assert self.uids is not None
        removed = self.uids.sweep()
        if removed:
            log.info("removed %d uid lock files nobody held", removed)

    def _cleanup_stale(self) -> None:
        """Remove what a previous run of this data directory left; touch nothing else."""
        self.instance_lock.acquire()
        for name in cgroups.instance_groups(self.instance):
            group = cgroups.Cgroup(self.instance, name)
            group.kill_all()
            with contextlib.suppress(OSError):
                group.remove()
            log.info("removed stale cgroup %s", name)
        self._remove_unowned()

    def _remove_unowned(self) -> None:
        """Remove the sandbox directories (and their mounts) that no open sandbox owns.

        Runs after every sandbox given back and every reaper period: the directory listing
        decides, and the mount table (which grows with the sandboxes) is read only when a
        directory is left over. A leftover mount always has its directory: a mount point is
        never removed (`remove_sandbox_dir`).
        """
        try:
            names = os.listdir(self.base_dir)
        except FileNotFoundError:
            return
        unowned = [name for name in names if name not in self._open]
        if not unowned:
            return
        leftover = set(unowned)
        for point in sorted(disk.mounts_under(self.base_dir), reverse=True):
            inside = Path(point).relative_to(self.base_dir).parts
            if inside and inside[0] in leftover:
                disk.unmount(point, lazy=True)
                log.info("unmounted a leftover workspace %s", point)
        for name in unowned:
            remove_sandbox_dir(self.base_dir / name)

    def sweep(self) -> None:
        reap_orphans(WorkerProcess.spawned)
        self._remove_unowned()

    async def close(self) -> None:
        self._users -= 1
        if self._users > 0:
            return  # another backend's sandboxes still use it
        if self.egress_proxy is not None:
            await self.egress_proxy.close()
        reap_orphans(WorkerProcess.spawned)
        await asyncio.to_thread(self._remove_unowned)  # nothing outlives the server's shutdown
        cgroups.remove_instance_dirs(self.instance)
        if self._own_store and self.trust_store is not None:
            with contextlib.suppress(SandboxError, OSError):
                disk.unmount(str(self.trust_store), lazy=True)
                self.trust_store.rmdir()
        with contextlib.suppress(OSError):
            (self.instance_lock.dir / self.instance).unlink()  # still ours: nobody can take it
        self.instance_lock.release()

    def memory(self) -> int:
        """What all of them are charged together (bytes)."""
        return cgroups.instance_memory(self.instance)

    def leftovers(self) -> dict[str, list[str]]:
        return {
            "cgroups": cgroups.instance_groups(self.instance),
            "mounts": disk.mounts_under(self.base_dir),
            "uids": sorted(str(u) for u in self.uids.held()) if self.uids else [],
        }


def reap_orphans(known: set[int]) -> None:
    """Reap the sandboxes' inner inits orphaned to us; asyncio reaps what it spawned itself."""
    me = os.getpid()
    for pid in _children(me):
        if pid in known:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                head, _, rest = f.read().rpartition(b")")
        except OSError:
            continue
        fields = rest.split()
        if head.endswith(ORPHAN_NAMES) and fields[0] == b"Z" and int(fields[1]) == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _children(me: int) -> list[int]:
    """Our child processes: from each thread's `children` list where the kernel has them.

    Reading only our own children keeps a sweep cheap however many processes the machine runs
    (a full walk of /proc reads every process's stat: ~40 ms with a thousand sandboxes).
    Without those lists (CONFIG_PROC_CHILDREN), every process is looked at.
    """
    if not os.path.exists(f"/proc/{me}/task/{me}/children"):
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    found: list[int] = []
    for task in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{task}/children") as f:
                found += (int(pid) for pid in f.read().split())
        except OSError:
            continue  # a thread that has just ended: its children went to another
    return found
