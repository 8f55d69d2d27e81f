"""Limits: memory, processes, CPU, disk, open files, output and time, each hit from inside."""

from __future__ import annotations

import time

import pytest

from sandbank.protocol.calls import RC_KILLED, RC_TIMEOUT
from sandbank.sandbox.backends.base import INTERPRETERS, LIMITS
from tests.sandbox.conftest import NOT_GVISOR, Shell

pytestmark = [pytest.mark.anyio, pytest.mark.claims(INTERPRETERS)]


@pytest.mark.claims(LIMITS)
async def test_memory_limit_kills_with_a_clear_message_and_next_call_gets_fresh_interpreter(
    sb: Shell,
) -> None:
    await sb.py("before = 1")
    mib = sb.runtime.settings.memory_limit_mb
    r = await sb.py(f"b = bytearray({mib * 2} * 1024 * 1024); print(len(b))")
    assert r.return_code == RC_KILLED
    assert f"killed: memory limit of {mib} MiB exceeded" in r.stderr
    assert "state (variables, imports) was lost" in r.stderr
    r = await sb.py("print('before' in globals())")
    assert (r.stdout, r.return_code) == ("False\n", 0)


@pytest.mark.claims(LIMITS)
@pytest.mark.only_backends(*NOT_GVISOR)  # gVisor's own bound: test_gvisor.py
async def test_process_limit_contains_a_fork_bomb(sb: Shell) -> None:
    limit = sb.runtime.settings.pids_limit
    r = await sb.py(
        "import os, time\npids, err = [], None\n"
        f"for _ in range({limit * 2}):\n"
        "    try:\n        pid = os.fork()\n    except OSError as e:\n        err = e.errno; break\n"
        "    if pid == 0:\n        time.sleep(30); os._exit(0)\n    pids.append(pid)\n"
        "print(len(pids), err)\n"
        "for p in pids: os.kill(p, 9); os.waitpid(p, 0)",
        timeout=30,
    )
    forked, err = r.stdout.split()
    assert int(forked) < limit and err == "11"  # EAGAIN from the pids cgroup
    assert (await sb.py("print('still fine')")).stdout == "still fine\n"


@pytest.mark.claims(LIMITS)
@pytest.mark.only_backends(*NOT_GVISOR)  # gVisor's own clocks count throttled time: test_gvisor.py
async def test_cpu_is_throttled_to_the_quota(sb: Shell) -> None:
    cpus = sb.runtime.settings.cpu_limit
    r = await sb.py(
        "import os, time, multiprocessing as mp\n"
        "def spin(t):\n    end = time.time() + t\n    while time.time() < end: pass\n"
        "ps = [mp.Process(target=spin, args=(1.5,)) for _ in range(2)]\n"
        "t0 = time.time(); [p.start() for p in ps]; [p.join() for p in ps]\n"
        "wall = time.time() - t0\n"
        "c = os.times(); print(c.children_user + c.children_system, wall)",
        timeout=30,
    )
    used, wall = map(float, r.stdout.split())
    # Two spinning processes for 1.5 s would use 3 CPU-seconds unthrottled.
    assert used <= cpus * wall * 1.3 + 0.2, (used, wall)


@pytest.mark.claims(LIMITS)
async def test_disk_limit_fails_inside_with_enospc(sb: Shell) -> None:
    mib = sb.runtime.settings.disk_limit_mb
    r = await sb.sh(f"dd if=/dev/zero of=big bs=1M count={mib * 2} 2>&1; echo rc=$?")
    assert "No space left on device" in r.stdout and "rc=1" in r.stdout
    r = await sb.sh("rm big && echo ok > small && cat small")
    assert r.stdout == "ok\n"


@pytest.mark.claims(LIMITS)
async def test_open_files_limit(sb: Shell) -> None:
    limit = sb.runtime.settings.open_files_limit
    r = await sb.py(
        "import resource\nfiles = []\n"
        "try:\n    while True: files.append(open('/dev/null'))\n"
        "except OSError as e: print(e.errno, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
        "for f in files: f.close()"
    )
    errno_, soft = map(int, r.stdout.split())
    assert errno_ == 24 and soft == limit  # EMFILE


async def test_timeout_interrupts_python_and_keeps_state(sb: Shell) -> None:
    await sb.py("kept = 'state'")
    t0 = time.monotonic()
    r = await sb.py("import time\nwhile True: time.sleep(0.05)", timeout=1)
    assert time.monotonic() - t0 < 1 + 5
    assert r.return_code == RC_TIMEOUT
    assert "KeyboardInterrupt" in r.stderr and "state is kept" in r.stderr
    assert (await sb.py("kept")).stdout == "'state'\n"


async def test_timeout_of_code_that_ignores_interrupts_restarts_the_interpreter(sb: Shell) -> None:
    await sb.py("kept = 1")
    t0 = time.monotonic()
    r = await sb.py(
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", timeout=1
    )
    assert time.monotonic() - t0 < 1 + 5
    assert r.return_code == RC_TIMEOUT
    assert "interpreter was killed and restarted" in r.stderr and "was lost" in r.stderr
    r = await sb.py("print('kept' in globals())")
    assert r.stdout == "False\n"


async def test_timeout_interrupts_a_python_subprocess(sb: Shell) -> None:
    r = await sb.py("import os\nos.system('sleep 30')\nprint('after')", timeout=1)
    assert r.return_code == RC_TIMEOUT
    assert (await sb.py("print(2)")).stdout == "2\n"


async def test_timeout_interrupts_bash_and_keeps_its_state(sb: Shell) -> None:
    await sb.sh("cd /tmp && export KEEP=1")
    t0 = time.monotonic()
    r = await sb.sh("sleep 30; echo never", timeout=1)
    assert time.monotonic() - t0 < 1 + 5
    assert r.return_code == RC_TIMEOUT and "never" not in r.stdout
    r = await sb.sh("pwd; echo $KEEP")
    assert r.stdout == "/tmp\n1\n"


async def test_timeout_of_bash_that_ignores_sigint_kills_the_command(sb: Shell) -> None:
    t0 = time.monotonic()
    r = await sb.sh("trap '' INT; sleep 30", timeout=1)
    assert time.monotonic() - t0 < 1 + 5
    assert r.return_code == RC_TIMEOUT and "killed" in r.stderr
    assert (await sb.sh("echo back")).stdout == "back\n"


async def test_crashes_report_what_happened(sb: Shell) -> None:
    r = await sb.py("import os; os._exit(3)")
    assert r.return_code == 3 and "exited with code 3" in r.stderr
    r = await sb.py("import ctypes; ctypes.string_at(0)")
    assert r.return_code == 139 and "segmentation fault" in r.stderr
    assert (await sb.py("print('fresh')")).stdout == "fresh\n"


async def test_a_call_arriving_during_a_slow_restart_still_answers_by_its_deadline(
    sb: Shell,
) -> None:
    await sb.py("import os; os._exit(1)")  # the restart now runs in the background
    t0 = time.monotonic()
    r = await sb.py("print('up')", timeout=0.001)
    assert time.monotonic() - t0 < 0.001 + 5
    assert r.return_code == RC_TIMEOUT and "restart" in r.stderr  # a restart takes ~100 ms
    assert (await sb.py("print('up')")).stdout == "up\n"
