"""Chooses and builds the sandbox backend from settings; owns this server's host-resource names."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import logging
import os
import secrets
import shutil
from pathlib import Path

from ..config import MiB, Settings
from ..egress.proxy import EgressProxy
from ..errors import IsolationUnavailable
from . import bwrap, cgroups, disk
from .managed import Limits, ManagedSandbox
from .uids import UidAllocator
from .unisolated import UnisolatedSandbox

log = logging.getLogger(__name__)
PR_SET_CHILD_SUBREAPER = 36


def limits_from(settings: Settings) -> Limits:
    return Limits(
        memory_bytes=settings.memory_limit_mb * MiB,
        pids=settings.pids_limit,
        cpus=settings.cpu_limit,
        disk_bytes=settings.disk_limit_mb * MiB,
        tmp_bytes=settings.tmp_limit_mb * MiB,
        open_files=settings.open_files_limit,
        output_bytes=settings.output_limit_bytes,
        grace=settings.interrupt_grace_seconds,
    )


def instance_id(data_dir: Path) -> str:
    """Stable per data directory, so a restart finds what a crashed run of it left behind."""
    return "i" + hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


def become_subreaper() -> None:
    """Orphans of sandboxes (bwrap's inner init) are reparented to us instead of PID 1."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans(known: set[int]) -> None:
    """Reap bwrap's inner inits orphaned to us; asyncio reaps the processes it spawned itself."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in known:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                head, _, rest = f.read().rpartition(b")")
        except OSError:
            continue
        fields = rest.split()
        if head.endswith(b"(bwrap") and fields[0] == b"Z" and int(fields[1]) == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(name), os.WNOHANG)


class SandboxFactory:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.isolated = settings.isolation == "bwrap"
        self.base_dir = (settings.data_dir / "sandboxes").resolve()
        self.instance = instance_id(settings.data_dir)
        self.limits = limits_from(settings)
        self.runtime_dir = settings.runtime_dir.resolve()
        self.uids: UidAllocator | None = None
        self.seccomp = b""
        self.egress_proxy: EgressProxy | None = None  # set by the runtime when egress is on

    def check(self) -> None:
        """Fail with a clear message when the chosen isolation cannot work on this machine."""
        if not self.isolated:
            log.warning(
                "!!! SANDBANK_ISOLATION=none: sandboxes are NOT isolated. Code runs as this "
                "server's user with its file system and network. Development use only. !!!"
            )
            return
        bwrap.check_available()
        python = self.runtime_dir / "bin" / "python3"
        if not python.exists():
            raise IsolationUnavailable(
                f"the sandbox runtime is missing at {self.runtime_dir}: run `make install` "
                "or set SANDBANK_RUNTIME_DIR"
            )
        # Sandbox uids must reach the runtime and their workspaces under the data directory.
        for target in (self.runtime_dir, self.base_dir.parent):
            for parent in (p for p in [target, *target.parents] if p.exists()):
                if parent.stat().st_mode & 0o001 == 0 and parent != self.base_dir.parent:
                    raise IsolationUnavailable(
                        f"{parent} is not traversable by other users, so sandbox users cannot "
                        f"reach {target}: move it or `chmod o+x {parent}`"
                    )
        self.seccomp = bwrap.default_seccomp()
        s = self.settings
        self.uids = UidAllocator(s.uid_lock_dir, s.uid_base, s.uid_count)

    def prepare_dirs(self) -> None:
        data = self.settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self.isolated:
            # Sandbox uids must traverse these to reach their own workspace (mode 0700 inside).
            os.chmod(data, os.stat(data).st_mode | 0o111)  # noqa: S103 - traverse only, no listing
            os.chmod(self.base_dir, 0o711)  # noqa: S103 - traverse only, no listing

    def new(self, preimport: bool) -> ManagedSandbox:
        sid = "s" + secrets.token_hex(8)
        if not self.isolated:
            return UnisolatedSandbox(
                sid,
                base_dir=self.base_dir,
                runtime_dir=self.runtime_dir,
                limits=self.limits,
                preimport=preimport,
            )
        assert self.uids is not None, "check() first"
        return bwrap.BwrapSandbox(
            sid,
            instance=self.instance,
            base_dir=self.base_dir,
            runtime_dir=self.runtime_dir,
            uids=self.uids,
            limits=self.limits,
            preimport=preimport,
            seccomp_program=self.seccomp,
            egress_proxy=self.egress_proxy,
        )

    async def cleanup_stale(self) -> None:
        await asyncio.to_thread(self._cleanup_stale_sync)

    def _cleanup_stale_sync(self) -> None:
        """Remove what a previous run of this data directory left; touch nothing else."""
        if self.isolated:
            for name in cgroups.instance_groups(self.instance):
                group = cgroups.Cgroup(self.instance, name)
                group.kill_all()
                group.remove()
                log.info("removed stale cgroup %s", name)
            for point in sorted(disk.mounts_under(self.base_dir), reverse=True):
                disk.unmount(point)
                log.info("unmounted stale workspace %s", point)
        if self.base_dir.exists():
            for child in self.base_dir.iterdir():
                shutil.rmtree(child, ignore_errors=True)

    def release_instance(self) -> None:
        """At shutdown, after every sandbox is gone: drop this instance's (empty) cgroup parents."""
        if self.isolated:
            cgroups.remove_instance_dirs(self.instance)

    def leftovers(self) -> dict[str, list[str]]:
        """Host resources this instance still holds (for leak tests and the soak benchmark)."""
        found: dict[str, list[str]] = {
            "cgroups": cgroups.instance_groups(self.instance) if self.isolated else [],
            "mounts": disk.mounts_under(self.base_dir),
            "dirs": sorted(p.name for p in self.base_dir.iterdir())
            if self.base_dir.exists()
            else [],
            "uids": sorted(str(u) for u in self.uids.held()) if self.uids else [],
        }
        return found
