"""The gvisor backend's own promises: user code runs on gVisor's kernel, bounded, and a closed
server leaves no runsc process, container, mount or cgroup. (The whole contract suite runs
against it with `SANDBANK_TEST_BACKENDS=gvisor`.)"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbank.errors import Conflict, Unprocessable
from sandbank.metrics import Metrics
from sandbank.protocol.calls import BashCall, ExecResult, PythonCall
from sandbank.protocol.sessions import SessionSpec
from sandbank.sandbox.backends.gvisor import GvisorBackend, probe_platform, runsc_processes
from sandbank.sandbox.local import LocalSandboxes
from sandbank.sandbox.sessions import ExecSession
from tests.support import gvisor_missing, settings
from tests.tiers import needs

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", autouse=True)
def _gvisor_runs_here() -> None:
    if (why := gvisor_missing()) is not None:
        pytest.skip(why)


KERNEL_PROBE = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    return r
out = {
    "bpf": call(321, 0, 0, 0), "perf_event_open": call(298, 0, 0, -1, -1, 0),
    "keyctl": call(250, 0, 0, 0, 0, 0), "init_module": call(175, 0, 0, 0),
    "kexec_load": call(246, 0, 0, 0, 0), "mount": call(165, 0, 0, 0, 0, 0),
    "ptrace_attach_1": call(101, 16, 1, 0, 0),
}
print(json.dumps([os.uname().release, open('/proc/version').read(), out]))
"""


@pytest.fixture(scope="module")
@needs("root")
async def runtime(module_data: Path) -> AsyncIterator[LocalSandboxes]:
    config = settings(module_data, cpu_limit=0.5, isolation="gvisor", gvisor_platform="ptrace")
    rt = LocalSandboxes(config, GvisorBackend(config))
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()


class Session:
    def __init__(self, runtime: LocalSandboxes, session: ExecSession) -> None:
        self.runtime = runtime
        self.id = session.id
        self.sandbox = session.sandbox

    async def run(self, code: str, bash: bool = False, timeout: float = 30) -> ExecResult:
        call = BashCall(code) if bash else PythonCall(code)
        return await self.runtime.execute(self.id, "tests", call, timeout)


@pytest.fixture(scope="module")
async def session(runtime: LocalSandboxes) -> AsyncIterator[Session]:
    info = await runtime.create("tests")
    yield Session(runtime, runtime.session(info.id, "tests"))
    await runtime.destroy(info.id, "tests")


async def test_user_code_runs_on_gvisors_kernel_not_the_hosts(session: Session) -> None:
    r = await session.run(KERNEL_PROBE)
    release, version, calls = json.loads(r.stdout)
    assert release != os.uname().release  # gVisor's own kernel answers, not the host's
    assert Path("/proc/version").read_text() != version
    assert all(ret == -1 for ret in calls.values()), calls
    # coreutils' statx (AT_NO_AUTOMOUNT, which runsc 2022-12 refuses) works through the shim
    r = await session.run("echo hi > f.txt; ls -l f.txt; stat -c %U f.txt", bash=True)
    assert r.return_code == 0 and "f.txt" in r.stdout and "sandbox" in r.stdout, r


async def test_workspace_files_are_the_sandbox_uids_on_the_host_and_shared_both_ways(
    session: Session,
) -> None:
    await session.run("open('made-inside.txt', 'w').write('in')")
    host = session.sandbox.workspace / "made-inside.txt"
    assert host.read_text() == "in" and host.stat().st_uid == session.sandbox.uid
    (session.sandbox.workspace / "from-host.txt").write_text("out")
    assert (await session.run("print(open('from-host.txt').read())")).stdout == "out\n"


async def test_timeout_interrupts_and_keeps_state(session: Session) -> None:
    await session.run("kept = 41")
    r = await session.run("import time; time.sleep(30)", timeout=1.5)
    assert r.return_code == 124 and "KeyboardInterrupt" in r.stderr
    assert (await session.run("print(kept + 1)")).stdout == "42\n"


async def test_a_fork_bomb_is_contained_and_the_session_recovers(session: Session) -> None:
    r = await session.run(
        "import os, time\n"
        "for _ in range(4096):\n"
        "    if os.fork() == 0:\n        time.sleep(30); os._exit(0)\n",
    )
    assert r.return_code != 0  # refused (EAGAIN) or the sandbox's memory limit killed it
    assert (await session.run("print('still fine')")).stdout == "still fine\n"


async def test_a_closed_server_leaves_no_runsc_process_container_mount_or_cgroup(
    runtime: LocalSandboxes,
) -> None:
    config = settings(runtime.settings.data_dir / "second", isolation="gvisor",
                      gvisor_platform="ptrace")  # fmt: skip
    other = GvisorBackend(config)
    rt = LocalSandboxes(config, other)
    await rt.start()
    info = await rt.create("tests")
    await rt.execute(info.id, "tests", BashCall("sleep 300 & echo started"), 10)
    assert runsc_processes(other.runsc.root)
    await rt.close()  # the session still open: the server's shutdown ends it
    assert not runsc_processes(other.runsc.root)
    assert all(not v for v in other.leftovers().values()), other.leftovers()


@pytest.mark.root  # it runs runsc: root, and five seconds of the fast tier
def test_the_platform_probe_picks_one_that_runs_and_leaves_nothing() -> None:
    before = {p for p in os.listdir("/tmp") if p.startswith("runsc-do")}
    assert probe_platform() in ("systrap", "kvm", "ptrace")
    assert {p for p in os.listdir("/tmp") if p.startswith("runsc-do")} <= before


async def test_the_cpu_quota_throttles_the_sentry(session: Session) -> None:
    """Measured on the host: gVisor's own clocks count the time it was throttled as run time."""
    sandbox = session.runtime.session(session.id, "tests").sandbox
    cpu = Path("/sys/fs/cgroup/cpu/sandbank") / session.runtime.backend.instance / sandbox.id

    def throttled() -> int:
        stat = dict(line.split() for line in (cpu / "cpu.stat").read_text().splitlines())
        return int(stat["throttled_time"])

    before = throttled()
    await session.run(
        "import time, multiprocessing as mp\n"
        "def spin():\n    end = time.time() + 1.0\n    while time.time() < end: pass\n"
        "ps = [mp.Process(target=spin) for _ in range(2)]\n"
        "[p.start() for p in ps]; [p.join() for p in ps]"
    )
    assert throttled() - before > 200_000_000  # > 0.2 s held back at the 0.5 CPU quota


# --- two isolations on one server (SANDBANK_ISOLATION_CHOICES) -------------------------------
FORCED = "abcdef12"  # a tenant id's first hex digits, as SANDBANK_TENANT_ISOLATION names it


@pytest.fixture(scope="module")
@needs("root")
async def tiers(module_data: Path) -> AsyncIterator[LocalSandboxes]:
    config = settings(
        module_data / "tiers", isolation="fork", isolation_choices="gvisor",
        gvisor_platform="ptrace", tenant_isolation=f"{FORCED}=gvisor", pool_size=1,
    )  # fmt: skip
    rt = LocalSandboxes(config)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()
        left = {k: v for b in rt.backends.values() for k, v in b.leftovers().items() if v}
        assert left == {}, left  # the shared host is given back once, by the last backend


async def test_one_server_offers_two_isolations_and_each_session_runs_the_one_it_got(
    tiers: LocalSandboxes,
) -> None:
    host_release = os.uname().release
    default = await tiers.create("tests")
    strong = await tiers.create("tests", SessionSpec(isolation="gvisor"))
    forced = await tiers.create(FORCED + "9999")  # no hint: the operator's choice for it
    assert (default.isolation, strong.isolation, forced.isolation) == ("fork", "gvisor", "gvisor")
    for info, tenant in ((default, "tests"), (strong, "tests"), (forced, FORCED + "9999")):
        r = await tiers.execute(info.id, tenant, PythonCall(KERNEL_PROBE), 30)
        release = json.loads(r.stdout)[0]
        assert (release == host_release) == (info.isolation == "fork"), (info, release)
    # Both pools are warm, the default's at its size and the other's at most two.
    assert tiers.pools["fork"].size == 1 and tiers.pools["gvisor"].size == 1
    # A fork session pauses; a gVisor one cannot (no snapshots: never resumed under fork).
    assert (await tiers.pause(default.id, "tests")).state == "paused"
    with pytest.raises(Conflict, match="gvisor"):
        await tiers.pause(strong.id, "tests")
    r = await tiers.execute(default.id, "tests", PythonCall("print('back')"), 30)
    assert r.stdout == "back\n"
    assert tiers.session(default.id, "tests").isolation == "fork"
    for info, tenant in ((default, "tests"), (strong, "tests"), (forced, FORCED + "9999")):
        await tiers.destroy(info.id, tenant)


async def test_a_hint_not_offered_or_not_allowed_is_refused_naming_the_choices(
    tiers: LocalSandboxes,
) -> None:
    with pytest.raises(Unprocessable, match="'fork', 'gvisor'"):
        await tiers.create("tests", SessionSpec(isolation="bwrap"))
    with pytest.raises(Unprocessable, match="SANDBANK_TENANT_ISOLATION"):
        await tiers.create(FORCED + "9999", SessionSpec(isolation="fork"))
    assert tiers.sessions() == []  # nothing was made for either


async def test_the_pool_gauge_counts_every_isolations_warm_sandboxes(
    tiers: LocalSandboxes,
) -> None:
    metrics = Metrics()
    metrics.watch_sandboxes(tiers)
    deadline = time.monotonic() + 60
    while any(p.ready < 1 for p in tiers.pools.values()) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    assert tiers.pools["fork"].ready == tiers.pools["gvisor"].ready == 1
    assert metrics.registry.get_sample_value("sandbank_pool_ready") == 2
