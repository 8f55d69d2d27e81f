"""How many live sessions a machine holds: the default of `SANDBANK_MAX_SESSIONS`.

An idle session costs what `bench/capacity.py --fill` measures (the drop of MemAvailable per
idle session that has imported pandas, over as many as the machine holds), with a margin. The
machine keeps room for the server (and its fork template) and for as many busy sessions at
their full memory limit as it has cores; what is left is shared by idle sessions. Past the
number, the least recently used idle session is reclaimed. Since idle sessions may grow, all of
a server's sandboxes together are also capped (`sessions_memory`, their parent cgroup's limit):
when they outgrow the machine, the kernel kills inside a sandbox, never the server.
"""

from __future__ import annotations

import os
from pathlib import Path

MiB = 1 << 20
# Measured per idle pandas session, filling a 24 GiB machine (bench/capacity.py --fill: fork
# 10.8 MiB over 1,925 sessions, bwrap 64.0 MiB over 323), plus a third for margin; `none` from
# the unisolated reference backend's 35-42 MiB.
IDLE_COST_MIB = {"fork": 15, "bwrap": 85, "gvisor": 160, "none": 56}
SERVER_RESERVE_MIB = 1024  # the server, the fork template, the page cache the runtime needs
FLOOR, CEILING = 4, 2000  # below the floor a server is not worth running; the ceiling: pids, fds
# The warm pool a fork server keeps: one per POOL_SHARE sessions, so a burst of new sessions
# (agents start many at once) is served from it; a pooled fork costs what an idle session does.
POOL_SHARE, POOL_MIN, POOL_MAX = 20, 2, 64
# The server's descriptors: its own, plus each sandbox's pipes and pidfd (counted in
# /proc/<server>/fd: 7 a sandbox with fork, 5 with bwrap), plus one per client connection.
FDS_BASE, FDS_PER_SANDBOX = 1024, 8
CONNECTIONS_DEFAULT, CONNECTIONS_FLOOR = 4096, 64
# The listener's backlog: asyncio accepts up to this many connections in one go, and each
# refused one is closed an event-loop turn or two later, so a burst past the cap holds up to
# about twice this many descriptors for a moment (bench/edges.py).
ACCEPT_BACKLOG = 1024
ACCEPT_BURST = 2 * ACCEPT_BACKLOG


def mem_total() -> int:
    """The memory this server may use: the machine's, or less where its own cgroup caps it.

    In a Kubernetes pod /proc/meminfo shows the node's memory; the pod's limit is on the
    server's cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`), and counting past it would
    let the kernel kill the server's pod instead of a sandbox.
    """
    with open("/proc/meminfo") as f:
        machine = next((int(r.split()[1]) * 1024 for r in f if r.startswith("MemTotal:")), 0)
    if not machine:
        raise OSError("no MemTotal in /proc/meminfo")
    try:
        with open("/proc/self/cgroup") as f:
            own = f.read()
    except OSError:
        return machine
    limits = [x for x in (_read_limit(path) for path in cgroup_limit_files(own)) if x]
    return min([machine, *limits])


def cgroup_limit_files(proc_self_cgroup: str, root: str = "/sys/fs/cgroup") -> list[str]:
    """The memory-limit files of this process's cgroup and its ancestors (v2, v1 or both).

    A limit set on an ancestor (a pod's, above the container's own group) binds as well.
    """
    files = []
    for line in proc_self_cgroup.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if hier == "0" and controllers == "":
            bases, name = [root, f"{root}/unified"], "memory.max"
        elif "memory" in controllers.split(","):
            bases, name = [f"{root}/memory"], "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for base in bases:
            for depth in range(len(parts), -1, -1):
                files.append("/".join([base, *parts[:depth], name]))
    return files


def _read_limit(path: str) -> int:
    """A cgroup memory limit in bytes; 0 for none ("max", v1's near-2^63 default, no file)."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return 0
    if not text.isdigit() or int(text) >= 1 << 62:
        return 0
    return int(text)


def derived_max_sessions(
    isolation: str,
    memory_limit_mb: int,
    uid_count: int,
    total: int | None = None,
    disk_room: int | None = None,
) -> int:
    """The default session count for this machine's memory and cores (README, "Capacity"),
    and its data disk: `disk_room` workspaces fit there, beside the warm pool's."""
    total_mib = (mem_total() if total is None else total) // MiB
    busy = max(2, os.cpu_count() or 1)
    budget = total_mib - SERVER_RESERVE_MIB - busy * memory_limit_mb
    n = budget // IDLE_COST_MIB.get(isolation, IDLE_COST_MIB["bwrap"])
    if disk_room is not None:
        n = min(n, disk_room - derived_pool_size(isolation, disk_room))
    return int(max(FLOOR, min(CEILING, uid_count, n)))


def disk_room(data_dir: Path, disk_limit_mb: int, reserve_mb: int) -> int:
    """How many workspaces of `disk_limit_mb` the data directory's file system holds now
    beside `reserve_mb` (each is allocated whole: sandbox/host/disk.py)."""
    path = data_dir.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    fs = os.statvfs(path)
    free = fs.f_bavail * fs.f_frsize - reserve_mb * MiB
    return max(0, free // (disk_limit_mb * MiB))


def derived_pool_size(isolation: str, max_sessions: int) -> int:
    """The default warm pool: a share of the sessions with `fork`, where a pooled one is cheap."""
    if isolation != "fork":
        return POOL_MIN
    return max(POOL_MIN, min(POOL_MAX, max_sessions // POOL_SHARE))


def derived_pool_growth(max_sessions: int) -> int:
    """The most a fork server's pool grows to after a burst: a burst like it served again."""
    return min(POOL_MAX, max_sessions)


def sessions_memory(total: int | None = None) -> int:
    """What all of a server's sandboxes together may use (bytes): the machine less the reserve."""
    total = mem_total() if total is None else total
    return max(total - SERVER_RESERVE_MIB * MiB, total // 2)


def connection_limit(sandboxes: int, wanted: int = 0) -> int:
    """How many client connections the server holds at once: `wanted` (0: the default), less
    when the open-files limit leaves less room beside the sandboxes' descriptors."""
    wanted = wanted or CONNECTIONS_DEFAULT
    soft, _ = raise_open_files(sandboxes, wanted + ACCEPT_BURST)
    room = soft - FDS_BASE - FDS_PER_SANDBOX * sandboxes - ACCEPT_BURST
    return min(wanted, max(CONNECTIONS_FLOOR, room))


def raise_open_files(sandboxes: int, connections: int = 0) -> tuple[int, int]:
    """Raise the server's soft RLIMIT_NOFILE toward what `sandboxes` and `connections` need;
    (soft, wanted).

    Only up to the hard limit (or the kernel's `nr_open`), which the server does not change.
    """
    import resource

    want = FDS_BASE + FDS_PER_SANDBOX * sandboxes + connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        with open("/proc/sys/fs/nr_open") as f:  # the kernel's own ceiling
            hard_cap = int(f.read())
    else:
        hard_cap = hard
    target = min(want, hard_cap)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft, want
