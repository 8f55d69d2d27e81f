"""How many live sessions a machine holds: the default of `SANDBANK_MAX_SESSIONS`.

An idle session costs what `bench/fork.py` measures (the drop of MemAvailable per idle session
that has imported pandas), with a margin. The machine keeps room for the server (and its fork
template) and for as many busy sessions at their full memory limit as it has cores; what is left
is shared by idle sessions. Past the number, the least recently used idle session is reclaimed.
Since idle sessions may grow, all of a server's sandboxes together are also capped
(`sessions_memory`, their parent cgroup's limit): when they outgrow the machine, the kernel kills
inside a sandbox, never the server.
"""

from __future__ import annotations

import os

MiB = 1 << 20
# Measured per idle pandas session (bench/fork.py, 50 sessions), plus a third for margin.
IDLE_COST_MIB = {"fork": 24, "bwrap": 96, "none": 56}
SERVER_RESERVE_MIB = 1024  # the server, the fork template, the page cache the runtime needs
FLOOR, CEILING = 4, 2000  # below the floor a server is not worth running; the ceiling: pids, fds
# The warm pool a fork server keeps: one per POOL_SHARE sessions, so a burst of new sessions
# (agents start many at once) is served from it; a pooled fork costs what an idle session does.
POOL_SHARE, POOL_MIN, POOL_MAX = 20, 2, 64
# The server's descriptors: its own, plus each sandbox's pipes, pidfd, loop and cgroup files.
FDS_BASE, FDS_PER_SANDBOX = 1024, 16


def mem_total() -> int:
    with open("/proc/meminfo") as f:
        for row in f:
            if row.startswith("MemTotal:"):
                return int(row.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def derived_max_sessions(
    isolation: str, memory_limit_mb: int, uid_count: int, total: int | None = None
) -> int:
    """The default session count for this machine's memory and cores (README, "Capacity")."""
    total_mib = (mem_total() if total is None else total) // MiB
    busy = max(2, os.cpu_count() or 1)
    budget = total_mib - SERVER_RESERVE_MIB - busy * memory_limit_mb
    n = budget // IDLE_COST_MIB.get(isolation, IDLE_COST_MIB["bwrap"])
    return int(max(FLOOR, min(CEILING, uid_count, n)))


def derived_pool_size(isolation: str, max_sessions: int) -> int:
    """The default warm pool: a share of the sessions with `fork`, where a pooled one is cheap."""
    if isolation != "fork":
        return POOL_MIN
    return max(POOL_MIN, min(POOL_MAX, max_sessions // POOL_SHARE))


def sessions_memory(total: int | None = None) -> int:
    """What all of a server's sandboxes together may use (bytes): the machine less the reserve."""
    total = mem_total() if total is None else total
    return max(total - SERVER_RESERVE_MIB * MiB, total // 2)


def raise_open_files(sandboxes: int) -> tuple[int, int]:
    """Raise the server's soft RLIMIT_NOFILE toward what `sandboxes` need; (soft, wanted).

    Only up to the hard limit (or the kernel's `nr_open`), which the server does not change.
    """
    import resource

    want = FDS_BASE + FDS_PER_SANDBOX * sandboxes
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
