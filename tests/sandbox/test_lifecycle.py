"""Lifecycles: destroy leaves nothing behind, crash recovery, uid claims, pool, lifetimes, capacity."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
import weakref
from pathlib import Path

import pytest

from sandbank.config import MiB, Settings
from sandbank.errors import AtCapacity, IsolationUnavailable, SessionNotFound
from sandbank.protocol.calls import PythonCall
from sandbank.protocol.sessions import SessionSpec
from sandbank.sandbox.backends import bwrap
from sandbank.sandbox.backends.base import HOST_RESOURCES, INTERPRETERS, Backend
from sandbank.sandbox.backends.bwrap import BwrapBackend
from sandbank.sandbox.host import cgroups, disk, machine
from sandbank.sandbox.host.slot import Slot
from sandbank.sandbox.host.uids import UidAllocator
from sandbank.sandbox.limits import limits_from
from sandbank.sandbox.local import LocalSandboxes
from tests.sandbox.conftest import NOT_GVISOR, Shell
from tests.support import UID_LOCK_DIR, data_dir, processes_of_uids, settings

pytestmark = [pytest.mark.anyio, pytest.mark.claims(INTERPRETERS)]


async def wait_until_gone(uids: set[int], timeout: float = 10.0) -> list[int]:
    """The processes of `uids` left once they had `timeout` seconds to be reaped."""
    deadline = time.monotonic() + timeout
    while (left := processes_of_uids(uids)) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return left


def _nothing_left(backend: Backend) -> dict[str, list[str]]:
    return {k: v for k, v in backend.leftovers().items() if v}


@pytest.mark.claims(HOST_RESOURCES)
@pytest.mark.only_backends(*NOT_GVISOR)  # no host process runs as its uid: test_gvisor.py
async def test_destroy_kills_every_process_and_removes_every_resource(
    runtime: LocalSandboxes,
) -> None:
    sh = Shell(runtime, await runtime.create("tests"))
    uid = sh.session.sandbox.uid
    await sh.sh("(sleep 1000 &) ; nohup sleep 1000 >/dev/null 2>&1 &")
    await sh.py("import subprocess; p = subprocess.Popen(['sleep', '1000'])")
    assert processes_of_uids({uid})
    await runtime.destroy(sh.session.id, "tests")
    await runtime.drain()
    assert await wait_until_gone({uid}) == []
    assert str(uid) not in runtime.backend.leftovers()["uids"]
    assert not sh.session.sandbox.workspace.exists()
    with pytest.raises(SessionNotFound):
        runtime.session(sh.session.id, "tests")


async def test_an_ended_session_is_freed_without_the_cycle_collector(
    runtime: LocalSandboxes,
) -> None:
    """The server freezes what lives as it settles (heap.py), so garbage in reference cycles
    waits for a rare full collection: an ended session (its sandbox, its worker, the readers
    that saw its pipes close, a traceback it showed) must be freed by reference counts alone."""
    gc.collect()
    gc.disable()
    try:
        sh = Shell(runtime, await runtime.create("tests"))
        assert (await sh.py("1/0")).return_code == 1
        sandbox = sh.session.sandbox
        parts = [weakref.ref(sandbox)]
        worker = getattr(sandbox, "_worker", None)
        if worker is not None:
            parts.append(weakref.ref(worker))
        await runtime.destroy(sh.session.id, "tests")
        await runtime.drain()
        del sh, sandbox, worker
        await asyncio.sleep(0)
        assert [part() for part in parts] == [None] * len(parts)
    finally:
        gc.enable()


async def test_fifty_create_destroy_cycles_leave_exactly_nothing_behind(machine: None) -> None:
    with data_dir() as d:
        rt = LocalSandboxes(settings(d))
        await rt.start()
        uids: set[int] = set()
        try:
            for _ in range(50):
                s = rt.session((await rt.create("cycle")).id, "cycle")
                uids.add(s.sandbox.uid)
                r = await rt.execute(s.id, "cycle", PythonCall("print('x')"), 10)
                assert r.stdout == "x\n"
                await rt.destroy(s.id, "cycle")
            await rt.drain()
            await rt.sweep()
            assert _nothing_left(rt.backend) == {}
            assert await wait_until_gone(uids) == []
        finally:
            await rt.close()
        # After shutdown even the instance's parent cgroups are gone.
        assert not any(
            (cgroups.ROOT / c / "sandbank" / rt.backend.instance).exists()
            for c in (*cgroups.V1_CONTROLLERS, cgroups.UNIFIED)
        )


@pytest.mark.claims(HOST_RESOURCES)
@pytest.mark.only_backends(*NOT_GVISOR)
async def test_the_sweep_removes_a_sandbox_left_mounted_and_touches_the_open_ones(
    runtime: LocalSandboxes,
) -> None:
    """A sandbox whose giving back failed half-way (its disk still mounted) is removed by the
    next sweep; the sweep reads the mount table only then, never unmounting an open one."""
    sh = Shell(runtime, await runtime.create("tests"))
    await sh.py("x = 1")
    base = runtime.backend.host.base_dir  # type: ignore[attr-defined]
    left = base / "left-over-sandbox"
    (left / "ws").mkdir(parents=True)
    disk.mount_tmpfs(left / "ws", 1 << 20)
    (left / "ws" / "file").write_text("kept by nobody")
    assert disk.is_mounted(left / "ws") and not disk.is_mounted(left)
    await runtime.sweep()
    assert not left.exists()
    assert str(left / "ws") not in disk.mounts_under(base)
    try:
        assert disk.is_mounted(sh.session.sandbox.workspace)
        assert (await sh.py("print(x)")).stdout == "1\n"
    finally:
        await runtime.destroy(sh.session.id, "tests")
        await runtime.drain()


async def test_a_restart_cleans_what_a_crashed_run_of_the_same_data_dir_left_only(
    machine: None,
) -> None:
    with data_dir() as d, data_dir() as other_dir:
        crashed = BwrapBackend(settings(d))
        crashed.check()
        await crashed.prepare()
        orphan = crashed.new(preimport=False)
        await orphan.start()  # never closed: as if the server was killed
        bystander_backend = BwrapBackend(settings(other_dir))
        bystander_backend.check()
        await bystander_backend.prepare()
        bystander = bystander_backend.new(preimport=False)
        await bystander.start()
        try:
            assert _nothing_left(crashed)
            uid = orphan.uid
            crashed.host.uids.release(uid) if crashed.host.uids else None  # the dead server's flock
            crashed.host.instance_lock.release()  # and its claim on the instance's cgroups
            rt = LocalSandboxes(settings(d))
            await rt.start()
            await rt.close()
            leftovers = crashed.leftovers()
            assert leftovers["cgroups"] == [] and leftovers["mounts"] == []
            assert leftovers["dirs"] == []
            assert await wait_until_gone({uid}) == []  # killed, and reaped (asynchronously)
            # Another data directory's sandbox was not touched.
            r = await bystander.execute(
                PythonCall("print('alive')"), asyncio.get_running_loop().time() + 10
            )
            assert r.stdout == "alive\n"
        finally:
            await bystander.close()
            await orphan.close()
            await crashed.close()
            await bystander_backend.close()


def test_uid_claims_are_exclusive_across_allocators(tmp_path: Path) -> None:
    a = UidAllocator(tmp_path, 500000, 4)
    b = UidAllocator(tmp_path, 500000, 4)
    got = [a.claim(), b.claim(), a.claim(), b.claim()]
    assert sorted(got) == [500000, 500001, 500002, 500003]
    with pytest.raises(AtCapacity):
        b.claim()
    a.release(got[0])
    assert b.claim() == got[0]


def test_uids_given_back_are_claimed_again_lowest_first(tmp_path: Path) -> None:
    alloc = UidAllocator(tmp_path, 600000, 8)
    first, second, third = alloc.claim(), alloc.claim(), alloc.claim()
    assert (first, second, third) == (600000, 600001, 600002)
    alloc.release(second)
    alloc.release(first)
    assert alloc.claim() == first
    assert alloc.claim() == second
    assert alloc.claim() == 600003  # none given back: the next never claimed
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(u) for u in range(600000, 600004)]


async def test_warm_pool_pre_imports_and_never_reuses_a_sandbox(machine: None) -> None:
    with data_dir() as d:
        rt = LocalSandboxes(settings(d, pool_size=1, pool_preimport=True))
        await rt.start()
        try:
            await rt.pool.wait_full(timeout=120)
            first = rt.session((await rt.create("pool")).id, "pool")
            r = await rt.execute(
                first.id, "pool", PythonCall("import sys; 'pandas' in sys.modules"), 20
            )
            assert r.stdout == "True\n"
            await rt.pool.wait_full(timeout=120)
            second = rt.session((await rt.create("pool")).id, "pool")
            assert second.sandbox is not first.sandbox
            assert second.sandbox.id != first.sandbox.id
            first_id, second_id = first.sandbox.id, second.sandbox.id
            await rt.destroy(first.id, "pool")
            await rt.destroy(second.id, "pool")
            await rt.drain()
            third = rt.session(
                (await rt.create("pool")).id, "pool"
            )  # a destroyed sandbox never comes back
            assert third.sandbox.id not in (first_id, second_id)
        finally:
            await rt.close()


async def test_an_empty_pool_means_a_slower_lease_not_a_refusal(runtime: LocalSandboxes) -> None:
    assert runtime.pool.size == 0
    s = await runtime.create("tests")
    assert (await runtime.execute(s.id, "tests", PythonCall("1+1"), 10)).stdout == "2\n"
    await runtime.destroy(s.id, "tests")


async def test_idle_timeout_and_max_lifetime_reclaim_sessions(runtime: LocalSandboxes) -> None:
    idle = await runtime.create("t", SessionSpec(idle_timeout=10))
    old = await runtime.create("t", SessionSpec(idle_timeout=100, max_lifetime=20))
    busy = await runtime.create("t", SessionSpec(idle_timeout=10))
    start = idle.last_activity_at
    call = asyncio.create_task(
        runtime.execute(busy.id, "t", PythonCall("import time; time.sleep(1)"), 10)
    )
    await asyncio.sleep(0.2)  # the call is in flight
    runtime.reap(now=start + 15)
    with pytest.raises(SessionNotFound):
        runtime.session(idle.id, "t")
    runtime.session(old.id, "t")  # touching does not extend the maximum lifetime
    runtime.session(busy.id, "t")  # a call in flight is not idleness
    runtime.reap(now=old.created_at + 21)
    with pytest.raises(SessionNotFound):
        runtime.session(old.id, "t")
    assert (await call).return_code == 0
    await runtime.destroy(busy.id, "t")


async def test_lifetime_hints_are_clamped_to_the_ceilings(runtime: LocalSandboxes) -> None:
    s = await runtime.create("tests", SessionSpec(idle_timeout=10**9, max_lifetime=10**9))
    assert s.idle_timeout == runtime.settings.idle_timeout_max
    assert s.max_lifetime == runtime.settings.max_lifetime_max
    await runtime.destroy(s.id, "tests")


async def test_capacity_reclaims_the_least_recently_used_idle_session_then_refuses(
    machine: None,
) -> None:
    with data_dir() as d:
        rt = LocalSandboxes(settings(d, max_sessions=2))
        await rt.start()
        try:
            a = await rt.create("t")
            b = await rt.create("t")
            rt.session(a.id, "t")  # a is now more recently used than b
            c = await rt.create("t")
            reclaimed = rt.session(b.id, "t")  # paused to make room, not ended
            assert reclaimed.paused or reclaimed.pausing
            calls = [
                asyncio.create_task(
                    rt.execute(x.id, "t", PythonCall("import time; time.sleep(2)"), 10)
                )
                for x in (a, c)
            ]
            await asyncio.sleep(0.5)
            with pytest.raises(AtCapacity):
                await rt.create("t")
            await asyncio.gather(*calls)
        finally:
            await rt.close()


async def test_tenants_do_not_see_each_others_sessions(runtime: LocalSandboxes) -> None:
    s = await runtime.create("alice")
    with pytest.raises(SessionNotFound):
        runtime.session(s.id, "bob")
    await runtime.destroy(s.id, "bob")  # not bob's: nothing happens
    runtime.session(s.id, "alice")
    await runtime.destroy(s.id, "alice")


async def test_calls_on_one_session_run_one_at_a_time_in_arrival_order(sb: Shell) -> None:
    await sb.py("log = []")
    calls = [
        asyncio.create_task(sb.py(f"import time; time.sleep(0.05); log.append({i})"))
        for i in range(5)
    ]
    await asyncio.gather(*calls)
    assert (await sb.py("log")).stdout == "[0, 1, 2, 3, 4]\n"


async def test_destroying_a_session_ends_its_running_call_with_a_result(
    runtime: LocalSandboxes,
) -> None:
    s = await runtime.create("tests")
    call = asyncio.create_task(
        runtime.execute(s.id, "tests", PythonCall("import time; time.sleep(30)"), 60)
    )
    await asyncio.sleep(0.5)
    await runtime.destroy(s.id, "tests")
    r = await asyncio.wait_for(call, 10)
    assert r.return_code != 0 and "destroyed" in r.stderr


def test_defaults_are_wired() -> None:
    s = Settings()
    lim = limits_from(s)
    assert (lim.memory_bytes, lim.pids, lim.cpus, lim.disk_bytes) == (
        1024 * MiB,
        256,
        1.0,
        1024 * MiB,
    )
    assert (lim.output_bytes, lim.open_files) == (MiB, 1024)
    assert s.put_file_max_bytes == 100 * MiB and s.exec_api == "on" and s.host == "127.0.0.1"
    slot = Slot(
        "sdefaults", instance="i", base_dir=Path("/nonexistent"),
        uids=UidAllocator(UID_LOCK_DIR, 1, 1), limits=lim, egress_proxy=None,
    )  # fmt: skip
    slot.uid = 123456
    sandbox = bwrap.BwrapStarter(
        slot, runtime_dir=Path("/r"), limits=lim, preimport=True, seccomp=b""
    )
    args = sandbox._argv(9, 10, {"/etc/passwd": 11})
    assert args[args.index("--size") + 1] == str(s.tmp_limit_mb * MiB)
    assert "--seccomp" in args and "--unshare-all" in args
    assert args[args.index("--file") : args.index("--file") + 3] == ["--file", "11", "/etc/passwd"]
    launcher = sandbox._launcher(12)
    assert str(lim.open_files) in launcher and "--reuid=123456" in launcher
    assert "--no-new-privs" in launcher and launcher[launcher.index("--args") + 1] == "12"


def test_missing_isolation_tools_fail_with_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(machine, "HOST_PATH", str(tmp_path))
    with pytest.raises(IsolationUnavailable, match="apt-get install bubblewrap"):
        bwrap.check_available()
    with pytest.raises(IsolationUnavailable, match="cgroup v1 controllers"):
        cgroups.check_available(tmp_path)


async def test_unisolated_mode_is_explicit_and_loud(
    caplog: pytest.LogCaptureFixture, machine: None
) -> None:
    with data_dir() as d:
        rt = LocalSandboxes(settings(d, isolation="none"))
        with caplog.at_level(logging.WARNING):
            await rt.start()
        try:
            assert "NOT isolated" in caplog.text
            s = await rt.create("t")
            r = await rt.execute(s.id, "t", PythonCall("import os; print(os.getuid())"), 10)
            assert r.stdout == f"{os.getuid()}\n"
        finally:
            await rt.close()


async def test_a_cancelled_call_is_interrupted_and_the_next_call_is_in_step(sb: Shell) -> None:
    await sb.py("kept = 'yes'")
    call = asyncio.create_task(
        sb.py("import time\nfor _ in range(600): time.sleep(0.05)\nkept = 'no'")
    )
    await asyncio.sleep(0.5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    r = await sb.py("print(kept)")
    assert (r.stdout, r.return_code) == ("yes\n", 0)  # the interrupted code stopped; state kept
    assert (await sb.py("print(2)")).stdout == "2\n"


def test_a_data_dir_sandbox_users_cannot_reach_fails_saying_so(
    tmp_path: Path, machine: None
) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    backend = BwrapBackend(settings(closed / "data"))
    with pytest.raises(IsolationUnavailable, match="not traversable"):
        backend.check()


@pytest.mark.claims(HOST_RESOURCES)
async def test_a_lease_cancelled_mid_start_leaves_nothing_and_the_next_lease_is_in_step(
    runtime: LocalSandboxes,
) -> None:
    for delay in (0.0, 0.001, 0.005, 0.02, 0.06, 0.15):
        task = asyncio.create_task(runtime.create("tests"))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            s = await task
            await runtime.destroy(s.id, "tests")  # it finished before the cancellation
    await runtime.drain()
    sh = Shell(runtime, await runtime.create("tests"))
    try:
        assert (await sh.py("print('in step')")).stdout == "in step\n"
    finally:
        await runtime.destroy(sh.session.id, "tests")
        await runtime.drain()
    left = {k: v for k, v in runtime.backend.leftovers().items() if v}
    assert left == {}, left


@pytest.mark.claims(HOST_RESOURCES)
async def test_all_sandboxes_of_a_server_share_one_memory_cap(runtime: LocalSandboxes) -> None:
    from sandbank import capacity

    group = cgroups.ROOT / "memory" / "sandbank" / runtime.backend.instance
    limit = int((group / "memory.limit_in_bytes").read_text())
    page = 4096
    assert limit // page == capacity.sessions_memory() // page
