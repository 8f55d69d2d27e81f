"""Lifecycles: destroy leaves nothing behind, crash recovery, uid claims, pool, lifetimes, capacity."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from sandbank.config import MiB, Settings
from sandbank.errors import AtCapacity, IsolationUnavailable, SessionNotFound
from sandbank.sandbox import bwrap, cgroups
from sandbank.sandbox.base import PythonCall
from sandbank.sandbox.factory import SandboxFactory, limits_from
from sandbank.sandbox.sessions import Runtime
from sandbank.sandbox.uids import UidAllocator
from tests.sandbox.conftest import Shell
from tests.support import UID_LOCK_DIR, data_dir, processes_of_uids, settings

pytestmark = pytest.mark.anyio


def _nothing_left(factory: SandboxFactory) -> dict[str, list[str]]:
    return {k: v for k, v in factory.leftovers().items() if v}


async def test_destroy_kills_every_process_and_removes_every_resource(runtime: Runtime) -> None:
    sh = Shell(runtime, await runtime.create("tests"))
    uid = sh.session.sandbox.uid
    await sh.sh("(sleep 1000 &) ; nohup sleep 1000 >/dev/null 2>&1 &")
    await sh.py("import subprocess; p = subprocess.Popen(['sleep', '1000'])")
    assert processes_of_uids({uid})
    await runtime.destroy(sh.session.id, "tests")
    await runtime.drain()
    assert processes_of_uids({uid}) == []
    assert str(uid) not in runtime.factory.leftovers()["uids"]
    assert not sh.session.sandbox.workspace.exists()
    with pytest.raises(SessionNotFound):
        runtime.get(sh.session.id, "tests")


async def test_fifty_create_destroy_cycles_leave_exactly_nothing_behind() -> None:
    with data_dir() as d:
        rt = Runtime(settings(d))
        await rt.start()
        uids: set[int] = set()
        try:
            for _ in range(50):
                s = await rt.create("cycle")
                uids.add(s.sandbox.uid)
                r = await rt.execute(s.id, "cycle", PythonCall("print('x')"), 10)
                assert r.stdout == "x\n"
                await rt.destroy(s.id, "cycle")
            await rt.drain()
            rt.reap()
            assert _nothing_left(rt.factory) == {}
            assert processes_of_uids(uids) == []
        finally:
            await rt.shutdown()
        # After shutdown even the instance's parent cgroups are gone.
        assert not any(
            (cgroups.ROOT / c / "sandbank" / rt.factory.instance).exists()
            for c in (*cgroups.V1_CONTROLLERS, cgroups.UNIFIED)
        )


async def test_a_restart_cleans_what_a_crashed_run_of_the_same_data_dir_left_only() -> None:
    with data_dir() as d, data_dir() as other_dir:
        crashed = SandboxFactory(settings(d))
        crashed.check()
        crashed.prepare_dirs()
        orphan = crashed.new(preimport=False)
        await orphan.start()  # never closed: as if the server was killed
        bystander_factory = SandboxFactory(settings(other_dir))
        bystander_factory.check()
        bystander_factory.prepare_dirs()
        bystander = bystander_factory.new(preimport=False)
        await bystander.start()
        try:
            assert _nothing_left(crashed)
            uid = orphan.uid
            crashed.uids.release(uid) if crashed.uids else None  # the dead server's flock
            rt = Runtime(settings(d))
            await rt.start()
            await rt.shutdown()
            leftovers = crashed.leftovers()
            assert leftovers["cgroups"] == [] and leftovers["mounts"] == []
            assert leftovers["dirs"] == []
            assert processes_of_uids({uid}) == []
            # Another data directory's sandbox was not touched.
            r = await bystander.execute(
                PythonCall("print('alive')"), asyncio.get_running_loop().time() + 10
            )
            assert r.stdout == "alive\n"
        finally:
            await bystander.close()
            await orphan.close()
            await crashed.stop()  # what a backend runs beside its sandboxes (a fork template)
            await bystander_factory.stop()


def test_uid_claims_are_exclusive_across_allocators(tmp_path: Path) -> None:
    a = UidAllocator(tmp_path, 500000, 4)
    b = UidAllocator(tmp_path, 500000, 4)
    got = [a.claim(), b.claim(), a.claim(), b.claim()]
    assert sorted(got) == [500000, 500001, 500002, 500003]
    with pytest.raises(AtCapacity):
        b.claim()
    a.release(got[0])
    assert b.claim() == got[0]


async def test_warm_pool_pre_imports_and_never_reuses_a_sandbox() -> None:
    with data_dir() as d:
        rt = Runtime(settings(d, pool_size=1, pool_preimport=True))
        await rt.start()
        try:
            await rt.pool.wait_full(timeout=120)
            first = await rt.create("pool")
            r = await rt.execute(
                first.id, "pool", PythonCall("import sys; 'pandas' in sys.modules"), 20
            )
            assert r.stdout == "True\n"
            await rt.pool.wait_full(timeout=120)
            second = await rt.create("pool")
            assert second.sandbox is not first.sandbox
            assert second.sandbox.id != first.sandbox.id
            await rt.destroy(first.id, "pool")
            await rt.destroy(second.id, "pool")
            await rt.drain()
            third = await rt.create("pool")  # a destroyed sandbox never comes back
            assert third.sandbox.id not in (first.sandbox.id, second.sandbox.id)
        finally:
            await rt.shutdown()


async def test_an_empty_pool_means_a_slower_lease_not_a_refusal(runtime: Runtime) -> None:
    assert runtime.pool.size == 0
    s = await runtime.create("tests")
    assert (await runtime.execute(s.id, "tests", PythonCall("1+1"), 10)).stdout == "2\n"
    await runtime.destroy(s.id, "tests")


async def test_idle_timeout_and_max_lifetime_reclaim_sessions() -> None:
    with data_dir() as d:
        rt = Runtime(settings(d, reaper_interval_seconds=0.2))
        await rt.start()
        try:
            idle = await rt.create("t", idle_timeout=1)
            old = await rt.create("t", idle_timeout=100, max_lifetime=2)
            busy = await rt.create("t", idle_timeout=1)
            call = asyncio.create_task(
                rt.execute(busy.id, "t", PythonCall("import time; time.sleep(2.5)"), 10)
            )
            await asyncio.sleep(1.8)
            with pytest.raises(SessionNotFound):
                rt.get(idle.id, "t")
            rt.get(old.id, "t")  # touching does not extend the maximum lifetime
            rt.get(busy.id, "t")  # a call in flight is not idleness
            await asyncio.sleep(0.8)
            with pytest.raises(SessionNotFound):
                rt.get(old.id, "t")
            assert (await call).return_code == 0
        finally:
            await rt.shutdown()


async def test_lifetime_hints_are_clamped_to_the_ceilings(runtime: Runtime) -> None:
    s = await runtime.create("tests", idle_timeout=10**9, max_lifetime=10**9)
    assert s.idle_timeout == runtime.settings.idle_timeout_max
    assert s.max_lifetime == runtime.settings.max_lifetime_max
    await runtime.destroy(s.id, "tests")


async def test_capacity_reclaims_the_least_recently_used_idle_session_then_refuses() -> None:
    with data_dir() as d:
        rt = Runtime(settings(d, max_sessions=2))
        await rt.start()
        try:
            a = await rt.create("t")
            b = await rt.create("t")
            rt.get(a.id, "t")  # a is now more recently used than b
            c = await rt.create("t")
            with pytest.raises(SessionNotFound):
                rt.get(b.id, "t")
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
            await rt.shutdown()


async def test_tenants_do_not_see_each_others_sessions(runtime: Runtime) -> None:
    s = await runtime.create("alice")
    with pytest.raises(SessionNotFound):
        runtime.get(s.id, "bob")
    await runtime.destroy(s.id, "bob")  # not bob's: nothing happens
    runtime.get(s.id, "alice")
    await runtime.destroy(s.id, "alice")


async def test_calls_on_one_session_run_one_at_a_time_in_arrival_order(sb: Shell) -> None:
    await sb.py("log = []")
    calls = [
        asyncio.create_task(sb.py(f"import time; time.sleep(0.05); log.append({i})"))
        for i in range(5)
    ]
    await asyncio.gather(*calls)
    assert (await sb.py("log")).stdout == "[0, 1, 2, 3, 4]\n"


async def test_destroying_a_session_ends_its_running_call_with_a_result(runtime: Runtime) -> None:
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
    sandbox = bwrap.BwrapSandbox(
        "sdefaults", instance="i", base_dir=Path("/nonexistent"), runtime_dir=Path("/r"),
        uids=UidAllocator(UID_LOCK_DIR, 1, 1), limits=lim, preimport=True, seccomp_program=b"",
    )  # fmt: skip
    sandbox.uid = 123456
    argv = sandbox._argv(9, 10)
    assert argv[argv.index("--size") + 1] == str(s.tmp_limit_mb * MiB)
    assert str(lim.open_files) in argv and "--seccomp" in argv and "--unshare-all" in argv
    assert "--reuid=123456" in argv and "--no-new-privs" in argv


def test_missing_isolation_tools_fail_with_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(bwrap, "HOST_PATH", str(tmp_path))
    with pytest.raises(IsolationUnavailable, match="apt-get install bubblewrap"):
        bwrap.check_available()
    with pytest.raises(IsolationUnavailable, match="cgroup v1 controllers"):
        cgroups.check_available(tmp_path)


async def test_unisolated_mode_is_explicit_and_loud(caplog: pytest.LogCaptureFixture) -> None:
    with data_dir() as d:
        rt = Runtime(settings(d, isolation="none"))
        with caplog.at_level(logging.WARNING):
            await rt.start()
        try:
            assert "NOT isolated" in caplog.text
            s = await rt.create("t")
            r = await rt.execute(s.id, "t", PythonCall("import os; print(os.getuid())"), 10)
            assert r.stdout == f"{os.getuid()}\n"
        finally:
            await rt.shutdown()


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


def test_a_data_dir_sandbox_users_cannot_reach_fails_saying_so(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    factory = SandboxFactory(settings(closed / "data"))
    with pytest.raises(IsolationUnavailable, match="not traversable"):
        factory.check()
