"""The default session count follows the machine's memory, the per-session limit and the backend."""

from __future__ import annotations

import os
from pathlib import Path

from sandbank import capacity
from sandbank.config import Settings

GiB = 1 << 30


def test_fork_sessions_are_counted_by_their_idle_cost_after_room_for_busy_ones() -> None:
    cpus = max(2, os.cpu_count() or 1)
    n = capacity.derived_max_sessions("fork", 1024, 50000, total=24 * GiB)
    cost = capacity.IDLE_COST_MIB["fork"]
    assert n == (24 * 1024 - capacity.SERVER_RESERVE_MIB - cpus * 1024) // cost
    bwrap = capacity.derived_max_sessions("bwrap", 1024, 50000, total=24 * GiB)
    assert n > 3 * bwrap  # a fork shares the template's pages
    # A bigger limit per session leaves less room for idle ones.
    assert capacity.derived_max_sessions("fork", 4096, 50000, total=24 * GiB) < n


def test_small_machines_get_the_floor_and_uids_bound_the_count() -> None:
    assert capacity.derived_max_sessions("fork", 1024, 50000, total=2 * GiB) == capacity.FLOOR
    assert capacity.derived_max_sessions("fork", 16, 10, total=64 * GiB) == 10


def test_the_setting_is_derived_only_when_left_at_zero() -> None:
    assert Settings(max_sessions=7).max_sessions == 7
    settings = Settings(isolation="fork", memory_limit_mb=512)
    room = capacity.disk_room(settings.data_dir, settings.disk_limit_mb, settings.disk_reserve_mb)
    derived = capacity.derived_max_sessions("fork", 512, 50000, disk_room=room)
    assert settings.max_sessions == derived


def test_the_data_disk_bounds_the_sessions_and_their_pool(tmp_path: Path) -> None:
    by_memory = capacity.derived_max_sessions("fork", 512, 50000, total=64 * GiB)
    assert capacity.derived_max_sessions("fork", 512, 50000, total=64 * GiB, disk_room=105) == 100
    assert capacity.derived_max_sessions("fork", 512, 50000, total=64 * GiB, disk_room=0) == (
        capacity.FLOOR
    )
    assert by_memory > 100
    fs = os.statvfs(tmp_path)
    free_mb = fs.f_bavail * fs.f_frsize // (1 << 20)
    assert capacity.disk_room(tmp_path / "not" / "yet", 1024, 0) in (
        free_mb // 1024 - 1,
        free_mb // 1024,
        free_mb // 1024 + 1,
    )
    assert capacity.disk_room(tmp_path, 1024, free_mb + 1) == 0


def test_sandboxes_together_leave_the_server_its_reserve() -> None:
    assert capacity.sessions_memory(24 * GiB) == 24 * GiB - capacity.SERVER_RESERVE_MIB * (1 << 20)
    assert capacity.sessions_memory(1 * GiB) == GiB // 2


def test_a_fork_server_pools_a_share_of_its_sessions_for_bursts() -> None:
    assert capacity.derived_pool_size("fork", 800) == 800 // capacity.POOL_SHARE
    assert capacity.derived_pool_size("fork", 10) == capacity.POOL_MIN
    assert capacity.derived_pool_size("fork", capacity.CEILING) == capacity.POOL_MAX
    # A pooled bwrap sandbox costs a whole interpreter: the pool stays small.
    assert capacity.derived_pool_size("bwrap", 800) == capacity.POOL_MIN


def test_the_pool_is_derived_only_when_left_at_minus_one() -> None:
    assert Settings(isolation="fork", pool_size=0).pool_size == 0
    assert Settings(isolation="fork", max_sessions=400).pool_size == 400 // capacity.POOL_SHARE
    assert Settings(isolation="bwrap", max_sessions=400).pool_size == capacity.POOL_MIN


def test_the_open_files_limit_is_raised_for_the_sessions_but_never_past_the_hard_limit() -> None:
    import resource

    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, saved[1]))
        soft, want = capacity.raise_open_files(10)
        assert want == capacity.FDS_BASE + 10 * capacity.FDS_PER_SANDBOX
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft == min(want, saved[1])
        soft, want = capacity.raise_open_files(10**9)  # more than any hard limit allows
        assert soft < want and resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft
        assert soft == saved[1] or saved[1] == resource.RLIM_INFINITY
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, saved)


POD_V2 = "0::/kubepods/burstable/pod1234/cri-abc\n"
HYBRID = "4:memory:/process_api/x\n1:cpu:/\n0::/\n"


def test_the_limit_files_are_the_groups_own_and_its_ancestors_on_v2_v1_or_both() -> None:
    v2 = capacity.cgroup_limit_files(POD_V2, "/cg")
    assert v2[:4] == [
        "/cg/kubepods/burstable/pod1234/cri-abc/memory.max",
        "/cg/kubepods/burstable/pod1234/memory.max",  # the pod's limit, above the container's
        "/cg/kubepods/burstable/memory.max",
        "/cg/kubepods/memory.max",
    ]
    assert "/cg/memory.max" in v2  # a cgroup namespace shows the container's group as the root
    hybrid = capacity.cgroup_limit_files(HYBRID, "/cg")
    assert hybrid[:3] == [
        "/cg/memory/process_api/x/memory.limit_in_bytes",
        "/cg/memory/process_api/memory.limit_in_bytes",
        "/cg/memory/memory.limit_in_bytes",
    ]
    assert "/cg/unified/memory.max" in hybrid and not any("/cpu" in f for f in hybrid)


def test_no_limit_is_read_as_none(tmp_path: Path) -> None:
    for text, want in (("max\n", 0), ("9223372036854771712\n", 0), ("3221225472\n", 3 * GiB)):
        (tmp_path / "memory.max").write_text(text)
        assert capacity._read_limit(str(tmp_path / "memory.max")) == want
    assert capacity._read_limit(str(tmp_path / "absent")) == 0
