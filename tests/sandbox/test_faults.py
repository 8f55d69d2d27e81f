"""What sandboxed code can do to its own session: each attack leaves the session usable."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from sandbank.protocol.calls import RC_KILLED, BashCall, EditorCall
from sandbank.sandbox.backends.base import INTERPRETERS, ISOLATION
from sandbank.sandbox.channel import WorkerProcess
from sandbank.sandbox.inside import protocol
from tests.sandbox.conftest import Shell

pytestmark = [pytest.mark.anyio, pytest.mark.claims(INTERPRETERS)]

FORGE_FRAME = (
    "import gc, os, time\n"
    "ch = [o for o in gc.get_objects() if type(o).__name__ == 'Channel'][0]\n"
    "os.write(ch.wfd, {frame!r})\n"
    "time.sleep(5)"
)


async def test_a_frame_over_the_cap_is_a_dead_worker_not_a_wedged_session(sb: Shell) -> None:
    await sb.py("kept = 1")
    r = await sb.py(FORGE_FRAME.format(frame=b"\xff\xff\xff\xff"))
    assert r.return_code == RC_KILLED and "broke the protocol" in r.stderr
    assert "state (variables, imports) was lost" in r.stderr
    for _ in range(3):  # every later call is in step
        assert (await sb.py("print('in step')")).stdout == "in step\n"


async def test_a_frame_that_is_not_json_is_a_dead_worker(sb: Shell) -> None:
    r = await sb.py(FORGE_FRAME.format(frame=b"\x00\x00\x00\x03abc"))
    assert r.return_code == RC_KILLED and "broke the protocol" in r.stderr
    assert (await sb.sh("echo fine")).stdout == "fine\n"


async def test_many_produced_files_are_listed_up_to_the_cap_and_counted(sb: Shell) -> None:
    count = protocol.MAX_FILES + 200
    r = await sb.py(
        f"import os\nos.makedirs('many', exist_ok=True)\n"
        f"for i in range({count}): open(f'many/{{i:05d}}' + 'n' * 150, 'w').close()"
    )
    assert r.return_code == 0, r.stderr
    assert len(r.files) == protocol.MAX_FILES
    assert "200 more produced files are not listed" in r.stderr
    assert (await sb.sh("rm -r many; echo gone")).stdout == "gone\n"


def test_a_reply_is_fitted_under_the_cap_whatever_the_output() -> None:
    huge = "\x01" * (protocol.MAX_REPLY // 2)  # escapes to 6 bytes each
    reply = protocol.result(huge, huge, 0, [f"f{i}" * 100 for i in range(5000)])
    assert len(protocol.encode(reply)) <= protocol.MAX_REPLY
    assert reply[protocol.FILES_CUT] == 5000 - protocol.MAX_FILES
    assert "truncated" in reply[protocol.STDOUT]


async def test_a_fork_of_user_code_never_answers_for_the_worker(sb: Shell) -> None:
    r = await sb.py(
        "import os, sys\nif os.fork() == 0:\n    sys.exit(0)\nos.wait()\nprint('parent')"
    )
    assert (r.stdout, r.return_code) == ("parent\n", 0), r.stderr
    r = await sb.py("import os\npid = os.fork()\nif pid == 0:\n    raise SystemExit(3)\nos.wait()")
    assert r.return_code == 0
    for i in range(3):  # results stay attributed to their own calls
        assert (await sb.py(f"print({i})")).stdout == f"{i}\n"


async def test_a_lone_surrogate_is_an_error_result_not_a_dead_worker(sb: Shell) -> None:
    await sb.py("kept = 'yes'")
    r = await sb.runtime.execute(sb.session.id, "tests", BashCall("echo \ud800"), 10)
    assert r.return_code == 1 and "failed inside the sandbox" in r.stderr
    r = await sb.runtime.execute(sb.session.id, "tests", EditorCall("view", "\udcff.txt"), 10)
    assert r.return_code == 1
    assert (await sb.py("print(kept)")).stdout == "yes\n"


async def test_output_printed_between_calls_is_not_shown_in_the_next_call(sb: Shell) -> None:
    r = await sb.py(
        "import threading, time\n"
        "def late():\n    time.sleep(0.3)\n    print('late', end='')\n"
        "threading.Thread(target=late).start()"
    )
    assert r.stdout == ""
    await asyncio.sleep(0.8)
    assert (await sb.py("print('now')")).stdout == "now\n"
    r = await sb.sh("(sleep 0.3; echo background) &")
    await asyncio.sleep(0.8)
    assert (await sb.sh("echo now")).stdout == "now\n"


async def test_bash_after_python_used_up_its_descriptors_is_an_error_result(sb: Shell) -> None:
    await sb.sh("exit 0")  # the next bash call starts a new shell
    r = await sb.py(
        "import os\nfds = []\ntry:\n    while True: fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        "except OSError as e: print(e.errno)"
    )
    assert r.stdout == "24\n"
    r = await sb.sh("echo hi")
    assert r.return_code == 1 and "bash could not be started" in r.stderr
    await sb.py("for fd in fds: os.close(fd)")
    assert (await sb.sh("echo hi")).stdout == "hi\n"


@pytest.mark.claims(ISOLATION)
async def test_a_workspace_chmodded_away_does_not_brick_restarts(sb: Shell) -> None:
    await sb.sh("chmod -R 644 /workspace")
    await sb.py("import os; os._exit(1)")
    r = await sb.py("import os; print(os.getcwd())")
    assert (r.stdout, r.return_code) == ("/workspace\n", 0), r.stderr


async def test_the_editor_refuses_a_fifo_at_once_and_keeps_the_interpreter(sb: Shell) -> None:
    await sb.py("kept = 'yes'")
    await sb.sh("mkfifo pipe")
    for command in ("view", "create", "str_replace"):
        call = EditorCall(command, "pipe", file_text="x", old_str="a", new_str="b")
        r = await sb.runtime.execute(sb.session.id, "tests", call, 5)
        assert r.return_code == 1 and "not a regular file" in r.stderr, (command, r)
    assert (await sb.py("print(kept)")).stdout == "yes\n"


async def test_an_edit_touching_many_lines_answers_with_a_bounded_snippet(sb: Shell) -> None:
    await sb.py("open('big.txt', 'w').write('start\\n' + 'line\\n' * 200000)")
    new = "x\n" * 300000
    call = EditorCall("str_replace", "big.txt", old_str="start\n", new_str=new)
    r = await sb.runtime.execute(sb.session.id, "tests", call, 20)
    assert r.return_code == 0, r.stderr
    assert "snippet cut" in r.stdout and len(r.stdout) < 64 * 1024
    call = EditorCall("str_replace", "big.txt", old_str="line", new_str="y")
    r = await sb.runtime.execute(sb.session.id, "tests", call, 20)
    assert r.return_code == 1 and "more" in r.stderr and len(r.stderr) < 4096


async def test_restarts_release_the_old_worker_descriptor_and_pid(sb: Shell) -> None:
    await sb.py("print(1)")
    fds = len(os.listdir("/proc/self/fd"))
    spawned = len(WorkerProcess.spawned)
    for _ in range(4):
        await sb.py("import os; os._exit(1)")
        assert (await sb.py("print(2)")).stdout == "2\n"
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert len(WorkerProcess.spawned) <= spawned


async def test_the_runtime_is_told_why_an_interpreter_is_replaced(sb: Shell) -> None:
    reasons: list[str] = []
    sb.session.sandbox.on_restart = reasons.append
    await sb.py("kept = 1")
    assert (await sb.py("import os; os.kill(os.getpid(), 9)")).return_code == 137
    await sb.py(FORGE_FRAME.format(frame=b"\x00\x00\x00\x03abc"))
    stubborn = (
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "open('stubborn-runs', 'w').close(); time.sleep(60)"
    )
    call = asyncio.create_task(sb.py(stubborn))
    # Once it runs (a restarted interpreter may take a second to start: gvisor's cold start)
    for _ in range(300):
        if (sb.session.sandbox.workspace / "stubborn-runs").exists():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    call.cancel()  # a cancelled run: its code ignores the interrupt, so the worker goes
    with contextlib.suppress(asyncio.CancelledError):
        await call
    assert (await sb.py("print('after')")).stdout == "after\n"
    assert reasons == ["crash", "protocol", "cancelled"]
