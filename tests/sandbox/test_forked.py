"""The fork backend's own promises: nothing shared between forks, and a supervised template."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import resource
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from sandbank.errors import IsolationUnavailable, SandboxError
from sandbank.protocol.calls import PythonCall
from sandbank.sandbox.backends import fork as forked
from sandbank.sandbox.backends import fork_template as template_module
from sandbank.sandbox.backends.fork_template import Template
from sandbank.sandbox.host import disk, layout, machine
from sandbank.sandbox.local import LocalSandboxes
from tests.sandbox.conftest import Shell
from tests.support import REPO, TEST_LIMITS, data_dir, processes_of_uids, settings

pytestmark = [pytest.mark.anyio, pytest.mark.only_backends("fork")]


@pytest.fixture(scope="module", autouse=True)
def isolation() -> Iterator[str]:
    """Whatever SANDBANK_TEST_BACKENDS says: these tests are about `fork`."""
    with mock.patch.dict(TEST_LIMITS, isolation="fork"):
        yield "fork"


def _template(runtime: LocalSandboxes) -> Template:
    assert isinstance(runtime.backend, forked.ForkBackend) and runtime.backend.template
    return runtime.backend.template


RANDOMS = (
    "import random, json, os, tempfile, multiprocessing, numpy as np\n"
    "print(json.dumps([random.random(), random.getrandbits(64), float(np.random.rand()),\n"
    "    int(np.random.randint(1 << 30)), float(np.random.default_rng().random()),\n"
    "    os.path.basename(tempfile.mktemp()),\n"
    "    multiprocessing.current_process().authkey.hex()]))"
)


async def test_two_sessions_never_draw_the_same_random_numbers(runtime: LocalSandboxes) -> None:
    draws = []
    for _ in range(3):
        sh = Shell(runtime, await runtime.create("tests"))
        try:
            r = await sh.py(RANDOMS)
            assert r.return_code == 0, r.stderr
            draws.append(json.loads(r.stdout))
        finally:
            await runtime.destroy(sh.session.id, "tests")
    for i, column in enumerate(zip(*draws, strict=True)):
        assert len(set(column)) == len(column), (i, column)


async def test_a_fork_holds_only_its_own_descriptors_signals_and_environment(sb: Shell) -> None:
    r = await sb.py(
        "import os, signal, json\n"
        "fds = {}\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        "        for fd in os.listdir(f'/proc/{pid}/fd'):\n"
        "            fds[f'{pid}/{fd}'] = os.readlink(f'/proc/{pid}/fd/{fd}')\n"
        "    except OSError: pass\n"
        "def name(h):\n"
        "    return {signal.SIG_DFL: 'DFL', signal.SIG_IGN: 'IGN'}.get(h) or h.__name__\n"
        "sigs = {s.name: name(signal.getsignal(s)) for s in (signal.SIGCHLD, signal.SIGTERM,\n"
        "    signal.SIGINT, signal.SIGPIPE)}\n"
        "print(json.dumps([fds, sigs, sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),\n"
        "    dict(os.environ), os.getcwd()]))"
    )
    assert r.return_code == 0, r.stderr
    fds, sigs, mask, env, cwd = json.loads(r.stdout)
    # No socket (the template's orders) and no namespace handle (the host's) anywhere inside.
    assert fds and not [t for t in fds.values() if t.startswith(("socket:", "mnt:"))], fds
    assert sigs == {
        "SIGCHLD": "DFL", "SIGTERM": "DFL", "SIGPIPE": "IGN", "SIGINT": "default_int_handler"
    }  # fmt: skip
    assert mask == []
    assert env["HOME"] == "/workspace" and env["MPLCONFIGDIR"] == "/tmp/.matplotlib"
    assert not any("fork-template" in v for v in env.values()), env  # the template's own dirs
    assert cwd == "/workspace"


async def test_the_data_stack_is_already_imported_and_matplotlib_is_clean(sb: Shell) -> None:
    r = await sb.py(
        "import sys, matplotlib.pyplot as plt\n"
        "print('pandas' in sys.modules, plt.get_fignums(), plt.get_backend())"
    )
    assert r.stdout == "True [] module://sandbank_mplbackend\n", r.stderr
    r = await sb.py("plt.plot([1, 2]); plt.title('fonts'); None")
    assert r.files == ["figure_1.png"] and r.stderr == "", r
    r = await sb.py("from PIL import Image; print(Image.open('figure_1.png').size)")
    assert r.stdout == "(640, 480)\n", r


async def test_a_dead_template_is_replaced_without_failing_leases_or_live_sessions(
    runtime: LocalSandboxes,
) -> None:
    template = _template(runtime)
    before = Shell(runtime, await runtime.create("tests"))
    await before.py("kept = 42")
    old_pid = template.pid
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    after = Shell(runtime, await runtime.create("tests"))  # a lease never fails for it
    try:
        assert (await after.py("print('new')")).stdout == "new\n"
        assert template.pid not in (None, old_pid)
        assert (await before.py("print(kept)")).stdout == "42\n"  # forked from the dead one
    finally:
        uids = {before.session.sandbox.uid, after.session.sandbox.uid}
        await runtime.destroy(before.session.id, "tests")
        await runtime.destroy(after.session.id, "tests")
        await runtime.drain()
    await runtime.sweep()  # the dead template's orphans came back to the server: reaped
    assert processes_of_uids(uids) == []


async def test_an_aged_or_changed_template_is_retired_after_its_sandboxes_end(
    machine: None,
) -> None:
    with data_dir() as d:
        rt = LocalSandboxes(settings(d, fork_template_max_forks=2))
        await rt.start()
        try:
            template = _template(rt)
            first = template.pid
            sessions = [await rt.create("t") for _ in range(3)]  # the third ages it
            for _ in range(200):
                if template.pid != first:
                    break
                await asyncio.sleep(0.05)
            assert template.pid not in (None, first) and template.generation == 2
            assert template.memory()["templates"] == 2  # the old one waits for its forks
            for s in sessions:
                r = await rt.execute(s.id, "t", PythonCall("print(1)"), 10)
                assert r.stdout == "1\n"
                await rt.destroy(s.id, "t")
            await rt.drain()
            for _ in range(200):
                if template.memory()["templates"] == 1:
                    break
                await asyncio.sleep(0.05)
            assert template.memory()["templates"] == 1
            # A changed runtime image (or inside/ code) also brings a new template.
            with mock.patch.object(Template, "_fingerprint", return_value=(("changed", 1),)):
                await asyncio.sleep(1.1)
                s = await rt.create("t")
                await rt.destroy(s.id, "t")
                for _ in range(200):
                    if template.generation == 3:
                        break
                    await asyncio.sleep(0.05)
            assert template.generation == 3
        finally:
            await rt.close()


async def test_sessions_forked_apart_in_time_have_different_hash_secrets(machine: None) -> None:
    """The str-hash secret is fixed at a template's start and shared by its forks: a template
    is replaced once older than `fork_template_max_age_seconds`, so only sessions forked
    within that long of each other share it."""
    probe = PythonCall("print(hash('another session would like to know'))")
    with data_dir() as d:
        rt = LocalSandboxes(
            settings(d, fork_template_max_forks=0, fork_template_max_age_seconds=1.0)
        )
        await rt.start()
        try:
            template = _template(rt)
            first = await rt.create("t")
            sibling = await rt.create("t")
            first_hash = (await rt.execute(first.id, "t", probe, 10)).stdout
            assert (await rt.execute(sibling.id, "t", probe, 10)).stdout == first_hash
            await asyncio.sleep(1.2)
            await rt.destroy((await rt.create("t")).id, "t")  # the aged template is noticed
            for _ in range(400):
                if template.generation == 2:
                    break
                await asyncio.sleep(0.05)
            assert template.generation == 2
            later = await rt.create("t")
            assert (await rt.execute(later.id, "t", probe, 10)).stdout != first_hash
        finally:
            await rt.close()


async def test_the_template_is_single_threaded_and_its_memory_is_reported_apart(
    runtime: LocalSandboxes,
) -> None:
    template = _template(runtime)
    assert template.pid is not None
    assert len(os.listdir(f"/proc/{template.pid}/task")) == 1  # a fork copies all of it
    # No object of the template holds a file: a child's renumbered descriptors would alias it.
    held = [
        os.readlink(f"/proc/{template.pid}/fd/{fd}")
        for fd in os.listdir(f"/proc/{template.pid}/fd")
    ]
    assert all(
        t == "/dev/null" or t.split(":")[0] in ("pipe", "socket", "mnt", "pid") for t in held
    ), held
    mem = template.memory()
    assert mem["templates"] == 1 and mem["pss"] > 20 * 2**20  # the data stack, once
    # Its heap is in huge pages: a fork copies fewer page tables (MADV_COLLAPSE, Linux 6.1).
    rollup = Path(f"/proc/{template.pid}/smaps_rollup").read_text()
    huge_kib = int(rollup.split("AnonHugePages:")[1].split()[0])
    if tuple(map(int, os.uname().release.split(".")[:2])) >= (6, 1):
        assert huge_kib >= 8 * 1024, rollup


async def test_no_host_path_reaches_the_environments_a_sandbox_can_read(sb: Shell) -> None:
    data = str(sb.runtime.settings.data_dir.resolve())
    r = await sb.sh("cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline | tr '\\0' '\\n'")
    assert r.stdout and data not in r.stdout and str(REPO) not in r.stdout, r.stdout


def _loops_backed_by(prefix: str) -> list[str]:
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().startswith(prefix):
                found.append(backing.parent.parent.name)
    return found


async def test_workspace_disks_are_copies_of_one_formatted_image_and_detach_on_destroy(
    runtime: LocalSandboxes,
) -> None:
    data = str(runtime.settings.data_dir.resolve())
    assert isinstance(runtime.backend, forked.ForkBackend)
    assert runtime.backend.formatted_disk.exists()
    sh = Shell(runtime, await runtime.create("tests"))
    r = await sh.sh("stat -c '%u %a' /workspace; ls -A /workspace | wc -l; df -m /workspace")
    uid = sh.session.sandbox.uid
    owner, entries, df = r.stdout.split("\n", 2)
    assert owner == f"{uid} 700" and entries == "0" and "/workspace" in df  # no lost+found
    assert _loops_backed_by(data)
    await runtime.destroy(sh.session.id, "tests")
    await runtime.drain()
    assert _loops_backed_by(data) == []


async def test_pid_1_is_the_small_static_init_and_it_reaps_orphans(sb: Shell) -> None:
    r = await sb.sh(
        "readlink /proc/1/exe; grep VmRSS /proc/1/status; "
        "for i in 1 2 3; do (sleep 0.1 &); done; sleep 0.5; "
        "grep -l '^State:.*Z' /proc/[0-9]*/status | wc -l"
    )
    exe, rss, zombies = r.stdout.split("\n", 2)
    assert exe == f"{layout.RUNTIME_MOUNT}/{forked.INIT_PROGRAM}", r  # exec'd: no Python heap
    assert int(rss.split()[1]) < 2048, rss  # kB
    assert zombies.strip() == "0", r
    r = await sb.py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert "segmentation fault" in r.stderr, r  # the status it reports names the signal
    assert (await sb.py("print('back')")).stdout == "back\n"


async def test_a_workspace_disk_that_fails_while_the_child_waits_fails_only_that_lease(
    runtime: LocalSandboxes,
) -> None:
    # The disk is made while the template forks; the child waits for it, and leaves without it.
    real = disk.create_from

    def no_room(*args: object) -> None:
        time.sleep(0.2)  # the fork is done and its child waiting by now
        raise SandboxError("no room for the workspace disk")

    with (
        mock.patch.object(disk, "create_from", no_room),
        pytest.raises(SandboxError, match="no room for the workspace disk"),
    ):
        await runtime.create("tests")
    await runtime.drain()
    left = {k: v for k, v in runtime.backend.leftovers().items() if v}
    assert left == {}, left
    assert disk.create_from is real
    sh = Shell(runtime, await runtime.create("tests"))  # the next lease is served
    try:
        assert (await sh.sh("touch /workspace/x && ls /workspace")).stdout == "x\n"
    finally:
        await runtime.destroy(sh.session.id, "tests")


async def test_a_template_that_stops_answering_is_replaced_and_the_lease_still_succeeds(
    machine: None,
) -> None:
    with data_dir() as d, mock.patch.object(template_module, "ORDER_TIMEOUT", 1.0):
        rt = LocalSandboxes(settings(d))
        await rt.start()
        template = _template(rt)
        hung = template.pid
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)
        try:
            s = await asyncio.wait_for(rt.create("t"), 60)
            assert template.pid not in (None, hung)
            r = await rt.execute(s.id, "t", PythonCall("print('served')"), 10)
            assert r.stdout == "served\n"
        finally:
            os.kill(hung, signal.SIGCONT)  # it sees its socket closed, and leaves
            await rt.close()


async def test_a_replaced_template_keeps_its_socket_until_the_order_in_flight_is_answered(
    runtime: LocalSandboxes,
) -> None:
    """Closing it under an order being sent would fail that lease for nothing."""
    template = _template(runtime)
    old = template._current
    assert old is not None
    async with old.lock:  # as while an order is in flight
        template._retire(old)
        await asyncio.sleep(0.05)
        assert old.sock.fileno() != -1  # still open
    await asyncio.sleep(0.05)
    assert old.sock.fileno() == -1  # closed once the order is done: the template leaves
    sh = Shell(runtime, await runtime.create("tests"))  # the next lease boots a new one
    try:
        assert (await sh.py("print('served')")).stdout == "served\n"
        assert template.pid not in (None, old.proc.pid)
    finally:
        await runtime.destroy(sh.session.id, "tests")


async def test_a_template_started_by_a_server_past_1024_descriptors_still_serves(
    machine: None,
) -> None:
    """A busy server holds thousands of descriptors; its template's socket keeps the number."""
    pair = socket.socketpair

    def high_pair(*args: Any) -> tuple[socket.socket, socket.socket]:
        ours, theirs = pair(*args)
        high = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD_CLOEXEC, 1500)
        theirs.close()
        return ours, socket.socket(fileno=high)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    try:
        with data_dir() as d:
            rt = LocalSandboxes(settings(d))
            with mock.patch.object(socket, "socketpair", high_pair):
                await rt.start()
            try:
                pid = _template(rt).pid
                assert pid is not None
                assert any(int(fd) >= 1024 for fd in os.listdir(f"/proc/{pid}/fd"))
                s = await asyncio.wait_for(rt.create("t"), 60)
                r = await rt.execute(s.id, "t", PythonCall("print('served')"), 10)
                assert r.stdout == "served\n"
                assert _template(rt).pid == pid  # the same template, alive
            finally:
                await rt.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_missing_tools_fail_with_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(machine, "HOST_PATH", str(tmp_path))
    with pytest.raises(IsolationUnavailable, match="apt-get install util-linux"):
        forked.check_available()
