"""Per-sandbox cgroups: memory, pids and cpu limits (cgroup v1), and the cgroup2 tree for kills.

Every group lives under `sandbank/<instance>/<sandbox>` in each hierarchy, so a server only
ever touches its own, and a restart of the same data directory can find what a crash left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from ...errors import IsolationUnavailable
from . import disk

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu")
UNIFIED = "unified"
CFS_PERIOD_US = 100_000
# cgroup2's mount option that makes moving a process between groups cheap (Linux 6.0+): without
# it every move waits out an RCU grace period, ~10 ms, on the path of each lease.
FAVOR_DYNMODS = "favordynmods"
MS_REMOUNT = 32


def check_available(root: Path = ROOT) -> None:
    missing = [c for c in V1_CONTROLLERS if not (root / c / "cgroup.procs").exists()]
    if missing:
        raise IsolationUnavailable(
            f"cgroup v1 controllers {', '.join(missing)} are not mounted under {root}; "
            "Sandbank needs memory, pids and cpu controllers to bound sandboxes "
            "(or run with SANDBANK_ISOLATION=none, unisolated, for development only)"
        )


class Cgroup:
    """One sandbox's group in each cgroup hierarchy."""

    def __init__(self, instance: str, name: str, root: Path = ROOT) -> None:
        self.root = root
        self.rel = Path("sandbank") / instance / name
        self.paths = [root / c / self.rel for c in V1_CONTROLLERS]
        if (root / UNIFIED / "cgroup.procs").exists():
            self.paths.append(root / UNIFIED / self.rel)

    @property
    def memory(self) -> Path:
        return self.paths[0]

    def create(self, memory_bytes: int, pids: int, cpus: float) -> None:
        for path in self.paths:
            path.mkdir(parents=True, exist_ok=True)
        mem = self.memory
        _write(mem / "memory.limit_in_bytes", memory_bytes)
        # Swap would let a session exceed its memory; count memory+swap against one limit.
        with contextlib.suppress(OSError):
            _write(mem / "memory.memsw.limit_in_bytes", memory_bytes)
        with contextlib.suppress(OSError):
            _write(mem / "memory.swappiness", 0)
        _write(self.paths[1] / "pids.max", pids)
        cpu = self.paths[2]
        _write(cpu / "cpu.cfs_period_us", CFS_PERIOD_US)
        _write(cpu / "cpu.cfs_quota_us", max(1000, int(cpus * CFS_PERIOD_US)))

    def procs_files(self) -> list[str]:
        return [str(p / "cgroup.procs") for p in self.paths]

    def pids(self) -> list[int]:
        try:
            text = (self.memory / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(x) for x in text.split()]

    def oom_kills(self) -> int:
        try:
            for line in (self.memory / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL every process in the group, again until none is left (a fork bomb races)."""
        unified = next((p for p in self.paths if UNIFIED in p.parts), None)
        if unified is not None:
            with contextlib.suppress(OSError):
                _write(unified / "cgroup.kill", 1)
        end = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > end:
                return
            time.sleep(0.002)

    def remove(self, timeout: float = 5.0) -> None:
        end = time.monotonic() + timeout
        for path in self.paths:
            while path.exists():
                try:
                    path.rmdir()
                except OSError:
                    if time.monotonic() > end:
                        raise
                    self.kill_all(timeout=0.5)
                    time.sleep(0.005)

    def exists(self) -> bool:
        return any(p.exists() for p in self.paths)


def limit_instance(instance: str, memory_bytes: int, root: Path = ROOT) -> None:
    """Cap the memory of all this instance's sandboxes together (their parent group)."""
    mem = root / V1_CONTROLLERS[0] / "sandbank" / instance
    mem.mkdir(parents=True, exist_ok=True)
    _write(mem / "memory.limit_in_bytes", memory_bytes)


def instance_memory(instance: str, root: Path = ROOT) -> int:
    """What all this instance's sandboxes are charged together (bytes; 0 before there are any)."""
    try:
        text = (
            root / V1_CONTROLLERS[0] / "sandbank" / instance / "memory.usage_in_bytes"
        ).read_text()
    except OSError:
        return 0
    return int(text)


def instance_groups(instance: str, root: Path = ROOT) -> list[str]:
    """Names of this instance's sandbox groups present in any hierarchy."""
    names: set[str] = set()
    for ctrl in (*V1_CONTROLLERS, UNIFIED):
        base = root / ctrl / "sandbank" / instance
        if base.is_dir():
            names.update(p.name for p in base.iterdir() if p.is_dir())
    return sorted(names)


def instances(root: Path = ROOT) -> set[str]:
    """Every server instance with a directory in any hierarchy (live or left behind)."""
    found: set[str] = set()
    for ctrl in (*V1_CONTROLLERS, UNIFIED):
        base = root / ctrl / "sandbank"
        if base.is_dir():
            found.update(p.name for p in base.iterdir() if p.is_dir())
    return found


def remove_instance(instance: str, root: Path = ROOT) -> int:
    """Kill what runs in an instance's groups and remove them all; how many groups."""
    names = instance_groups(instance, root)
    for name in names:
        group = Cgroup(instance, name, root)
        group.kill_all()
        with contextlib.suppress(OSError):
            group.remove()
    remove_instance_dirs(instance, root)
    return len(names)


def remove_empty_groups(instance: str, older_than: float, root: Path = ROOT) -> int:
    """Remove an instance's groups that hold no process and were made before `older_than`
    (a time), and then its directories if they are empty and as old; how many groups."""
    removed = 0
    for ctrl in (*V1_CONTROLLERS, UNIFIED):
        base = root / ctrl / "sandbank" / instance
        if not base.is_dir():
            continue
        for group in [p for p in base.iterdir() if p.is_dir()]:
            with contextlib.suppress(OSError):
                if group.stat().st_ctime < older_than and not (group / "cgroup.procs").read_text():
                    group.rmdir()
                    removed += 1
        with contextlib.suppress(OSError):
            if base.stat().st_ctime < older_than:
                base.rmdir()  # only succeeds once empty
    return removed


def remove_instance_dirs(instance: str, root: Path = ROOT) -> None:
    for ctrl in (*V1_CONTROLLERS, UNIFIED):
        with contextlib.suppress(OSError):
            (root / ctrl / "sandbank" / instance).rmdir()


def cgroup2_mount(mountinfo: str, root: Path = ROOT) -> tuple[str, str] | None:
    """(mount point, super-block options) of the cgroup2 tree under `root`, if there is one."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        tail = line.split(" - ", 1)[1].split()
        point = fields[4]
        if tail and tail[0] == "cgroup2" and Path(point).is_relative_to(root):
            return point, tail[2] if len(tail) > 2 else ""
    return None


def remount_data(options: str) -> str:
    """The options to remount cgroup2 with: what it has, less rw/ro, plus favordynmods."""
    kept = [o for o in options.split(",") if o and o not in ("rw", "ro", FAVOR_DYNMODS)]
    return ",".join([*kept, FAVOR_DYNMODS])


def favor_dynamic_moves(root: Path = ROOT) -> str:
    """Make moves into a cgroup cheap: "on" (already), "enabled" (by us) or "absent" (no cgroup2).

    Raises OSError when the kernel or our privileges refuse; the server then runs as before,
    each lease paying one RCU grace period more.
    """
    with open("/proc/self/mountinfo") as f:
        found = cgroup2_mount(f.read(), root)
    if found is None:
        return "absent"
    point, options = found
    if FAVOR_DYNMODS in options.split(","):
        return "on"
    disk.sys_mount(None, Path(point), None, MS_REMOUNT, remount_data(options))
    return "enabled"


def _write(path: Path, value: int | str) -> None:
    with open(path, "w") as f:
        f.write(str(value))
