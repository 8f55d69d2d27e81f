"""One isolated sandbox's host resources: uid, cgroups, directory, workspace disk, egress socket.

Claimed once and given back once, whichever backend starts the processes (bwrap and fork both
compose a slot). A claim cancelled midway (its client left) leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from ...egress.proxy import EgressProxy
from ..channel import WorkerProcess
from ..limits import Limits
from . import cgroups, disk
from .uids import UidAllocator

log = logging.getLogger(__name__)


class Slot:
    """A sandbox's uid, cgroups, directory (`<base>/<id>`), workspace disk and egress socket.

    With `formatted_disk` (a blank ext4 image), the workspace disk is copied from it in the
    background while the caller starts processes, which wait for it with `disk_made`.
    """

    def __init__(
        self,
        sandbox_id: str,
        *,
        instance: str,
        base_dir: Path,
        uids: UidAllocator,
        limits: Limits,
        egress_proxy: EgressProxy | None,
        formatted_disk: Path | None = None,
        kept_disk: tuple[Path, int] | None = None,
        on_released: Callable[[str], None] = lambda _id: None,
    ) -> None:
        self.id = sandbox_id
        self.dir = base_dir / sandbox_id
        self.uids = uids
        self.limits = limits
        self.egress_proxy = egress_proxy
        self.formatted_disk = formatted_disk
        # A paused session's disk, mounted where it is kept, and the uid its files belonged to.
        self.kept_disk = kept_disk
        self.on_released = on_released
        self.cgroup = cgroups.Cgroup(instance, sandbox_id)
        self.uid = 0
        self.root_policy: tuple[int, int, int] | None = None
        self._acquired = False
        self._disk: asyncio.Future[None] | None = None

    @property
    def workspace(self) -> Path:
        return self.dir / "ws"

    @property
    def image(self) -> Path:
        return self.kept_disk[0] if self.kept_disk is not None else self.dir / "disk.img"

    @property
    def egress_dir(self) -> Path:
        return self.dir / "egress"

    async def acquire(self) -> None:
        # The thread making the disk and cgroups runs on regardless of a cancellation: wait
        # for it, then undo it.
        task = asyncio.ensure_future(self._acquire_all())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await task
            await self.release()
            raise

    async def _acquire_all(self) -> None:
        self._acquired = True
        self.uid = self.uids.claim()
        self.root_policy = (self.uid, self.uid, 0o700)
        background = (
            self.kept_disk is None
            and self.formatted_disk is not None
            and self.formatted_disk.exists()
        )
        await asyncio.to_thread(self._make, background)
        if background:
            assert self.formatted_disk is not None
            self.root_policy = None  # nothing to restore until the disk is there (`disk_made`)
            self._disk = asyncio.ensure_future(
                asyncio.to_thread(
                    disk.create_from,
                    self.formatted_disk,
                    self.image,
                    self.workspace,
                    self.uid,
                    self.limits.disk_reserve_bytes,
                )
            )
        if self.egress_proxy is not None:
            # Its own tmpfs: the bind then names no host path in the sandbox's mountinfo.
            self.egress_dir.mkdir(mode=0o755)
            disk.mount_tmpfs(self.egress_dir, 64 << 10, noexec=True)
            await self.egress_proxy.open(self.id, self.egress_dir, self.uid)

    def _make(self, background_disk: bool) -> None:
        self.dir.mkdir(mode=0o711, parents=True)
        lim = self.limits
        self.cgroup.create(lim.memory_bytes, lim.pids, lim.cpus)
        if self.kept_disk is not None:
            image, previous_uid = self.kept_disk
            disk.remount_kept(image, self.workspace, self.uid, previous_uid, lim.disk_reserve_bytes)
        elif background_disk:
            self.workspace.mkdir(mode=0o700)  # the disk's mount point
        else:
            disk.create(
                self.image, self.workspace, lim.disk_bytes, self.uid, lim.disk_reserve_bytes
            )

    async def disk_made(self) -> None:
        """Wait for the workspace disk made in the background (raises what making it did)."""
        if self._disk is None:
            return
        try:
            await asyncio.shield(self._disk)
            self.root_policy = (self.uid, self.uid, 0o700)
        finally:
            # Done or failed, it is no longer pending; a cancelled wait leaves it to `release`,
            # which waits for the thread before removing anything.
            if self._disk.done():
                self._disk = None

    async def kill_all(self) -> None:
        if self._acquired:
            await asyncio.to_thread(self.cgroup.kill_all)

    def oom_count(self) -> int:
        return self.cgroup.oom_kills()

    async def keep_disk(self, dest: Path) -> None:
        await self.disk_made()
        await asyncio.to_thread(disk.keep, self.image, self.workspace, dest)
        self.kept_disk = (dest, self.uid)

    async def freeze_copy(self, dest: Path) -> None:
        await self.disk_made()
        await asyncio.to_thread(disk.frozen_copy, self.image, self.workspace, dest)

    async def release(self) -> None:
        if not self._acquired:
            self.on_released(self.id)  # never started (a paused session's next sandbox)
            return
        self._acquired = False
        if self._disk is not None:
            with contextlib.suppress(BaseException):
                await self._disk  # its thread mounts on our directory: let it finish first
            self._disk = None
        try:
            if self.egress_proxy is not None:
                await self.egress_proxy.close_sandbox(self.id)
            await asyncio.to_thread(self._release_sync)
        finally:
            if self.uid:
                self.uids.release(self.uid)
            self.on_released(self.id)

    def _release_sync(self) -> None:
        """Give everything back; a step that fails is logged and the next ones still run."""
        try:
            self.cgroup.kill_all()
            self.cgroup.remove()
        except OSError as e:
            log.warning("sandbox %s: its cgroup is not removed yet: %s", self.id, e)
        remove_sandbox_dir(self.dir)


def remove_sandbox_dir(path: Path) -> None:
    """Unmount a sandbox's disk (lazily, if a file on it is still open) and remove its files."""
    try:
        if disk.is_mounted(path / "egress"):
            disk.unmount(str(path / "egress"), lazy=True)
        disk.destroy(path / "disk.img", path / "ws")
    except Exception as e:  # noqa: BLE001 - retried by the sweep; the rest still runs
        log.warning("sandbox %s: its disk is not removed yet: %s", path.name, e)
    if not disk.is_mounted(path / "ws"):
        shutil.rmtree(path, ignore_errors=True)


class IsolatedBox:
    """The supervisor's `Box` for an isolated sandbox: a slot, and how its worker starts."""

    def __init__(
        self,
        slot: Slot,
        launch: Callable[[], Awaitable[WorkerProcess]],
        before_kill: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.slot = slot
        self._launch = launch
        self._before_kill = before_kill  # a runtime's own way to stop its processes first

    @property
    def uid(self) -> int:
        return self.slot.uid

    @property
    def root_policy(self) -> tuple[int, int, int] | None:
        return self.slot.root_policy

    @root_policy.setter
    def root_policy(self, policy: tuple[int, int, int] | None) -> None:
        self.slot.root_policy = policy

    @property
    def workspace(self) -> Path:
        return self.slot.workspace

    async def acquire(self) -> None:
        await self.slot.acquire()

    async def launch(self) -> WorkerProcess:
        return await self._launch()

    async def kill_everything(self, worker: WorkerProcess | None) -> None:
        if self._before_kill is not None:
            await self._before_kill()
        if worker is not None:
            worker.kill()
        await self.slot.kill_all()
        if worker is not None:
            await worker.wait(timeout=2.0)

    async def release(self) -> None:
        await self.slot.release()

    def oom_count(self) -> int:
        return self.slot.oom_count()

    async def keep_disk(self, dest: Path) -> None:
        await self.slot.keep_disk(dest)

    async def freeze_copy(self, dest: Path) -> None:
        await self.slot.freeze_copy(dest)
