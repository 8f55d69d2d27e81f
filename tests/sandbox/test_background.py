"""Beside calls: background processes, watches, Python contexts and notebook calls (every
backend with real interpreters); what the E2B door stands on."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandbank.errors import AlreadyExists, BadRequest, Conflict, NotFound, PathEscape
from sandbank.protocol.calls import PythonCall
from sandbank.protocol.filesystem import FsChange
from sandbank.protocol.processes import Exited, ProcessEvent, ProcessOutput, ProcessSpec, Started
from sandbank.sandbox.backends.base import INTERPRETERS
from sandbank.sandbox.local import LocalSandboxes
from sandbank.sandbox.sessions import ExecSession

pytestmark = [pytest.mark.anyio, pytest.mark.claims(INTERPRETERS)]
T = "tests"
# Whether a `sleep` is left, once the kill has been delivered and the dead reaped (up to 3 s).
GONE_SLEEP = (
    "import subprocess, time\n"
    "for _ in range(30):\n"
    "    if subprocess.run(['pgrep', '-x', 'sleep'], capture_output=True).returncode == 1:\n"
    "        break\n"
    "    time.sleep(0.1)\n"
    "print(subprocess.run(['pgrep', '-x', 'sleep'], capture_output=True).returncode)"
)


def bash(command: str, **kwargs: object) -> ProcessSpec:
    return ProcessSpec("/bin/bash", ("-c", command), **kwargs)  # type: ignore[arg-type]


async def run(
    runtime: LocalSandboxes, session: ExecSession, spec: ProcessSpec
) -> list[ProcessEvent]:
    return [e async for e in runtime.start_process(session.id, T, spec)]


async def test_a_process_streams_its_output_and_its_end(
    runtime: LocalSandboxes, session: ExecSession
) -> None:
    events = await run(runtime, session, bash("echo out; echo err >&2; exit 3"))
    assert isinstance(events[0], Started) and events[-1] == Exited(3, True, "exit status 3")
    out = b"".join(e.data for e in events if isinstance(e, ProcessOutput) and e.stream == "stdout")
    err = b"".join(e.data for e in events if isinstance(e, ProcessOutput) and e.stream == "stderr")
    assert (out, err) == (b"out\n", b"err\n")


async def test_output_comes_while_the_process_runs(
    runtime: LocalSandboxes, session: ExecSession
) -> None:
    seen: list[float] = []
    started = time.monotonic()
    async for event in runtime.start_process(
        session.id, T, bash("for i in 1 2 3; do echo $i; sleep 0.3; done")
    ):
        if isinstance(event, ProcessOutput):
            seen.append(time.monotonic() - started)
    assert len(seen) == 3 and seen[-1] - seen[0] > 0.4


async def test_a_background_process_is_listed_signalled_and_outlives_its_listener(
    runtime: LocalSandboxes, session: ExecSession, backend_name: str
) -> None:
    events = runtime.start_process(session.id, T, bash("sleep 30 & wait", tag="sleeper"))
    started = await anext(events)
    assert isinstance(started, Started)
    await events.aclose()  # type: ignore[attr-defined]  # nobody listens: it goes on
    listed = await runtime.list_processes(session.id, T)
    assert [(p.pid, p.spec.tag) for p in listed] == [(started.pid, "sleeper")]
    follow = runtime.connect_process(session.id, T, started.pid)
    assert await anext(follow) == Started(started.pid)
    await runtime.signal_process(session.id, T, started.pid, "KILL")
    end = [e async for e in follow][-1]
    assert end == Exited(-1, False, "signal: killed")
    assert await runtime.list_processes(session.id, T) == []
    # The whole group went: the `sleep` child too (the unisolated backend sees the host's).
    r = await runtime.execute(
        session.id,
        T,
        PythonCall(GONE_SLEEP),
        20,
    )
    assert r.stdout == "1\n" or backend_name == "none", r.stderr
    with pytest.raises(NotFound):
        await runtime.signal_process(session.id, T, started.pid, "KILL")


async def test_a_session_that_ran_processes_pauses_and_ends_cleanly(
    runtime: LocalSandboxes, session: ExecSession
) -> None:
    # The process was asked for on the worker's interrupt channel; the pause closes that
    # channel after the worker is gone, which must not fail the pause.
    assert isinstance((await run(runtime, session, bash("echo hi")))[-1], Exited)
    try:
        paused = await runtime.pause(session.id, T)
    except Conflict:
        pytest.skip(f"{runtime.backend.name} does not pause")
    assert paused.state == "paused"
    r = await runtime.execute(session.id, T, PythonCall("print(2)"), 30)
    assert (r.stdout, r.return_code) == ("2\n", 0)
    assert isinstance((await run(runtime, session, bash("echo again")))[-1], Exited)


async def test_stdin_and_its_end(runtime: LocalSandboxes, session: ExecSession) -> None:
    events = runtime.start_process(session.id, T, bash("cat; echo done", stdin=True))
    started = await anext(events)
    assert isinstance(started, Started)
    await runtime.send_stdin(session.id, T, started.pid, b"abc\n")
    await runtime.close_stdin(session.id, T, started.pid)
    rest = [e async for e in events]
    assert b"".join(e.data for e in rest if isinstance(e, ProcessOutput)) == b"abc\ndone\n"
    closed = runtime.start_process(session.id, T, bash("sleep 5"))
    pid = (await anext(closed)).pid  # type: ignore[union-attr]
    with pytest.raises(Conflict):
        await runtime.send_stdin(session.id, T, pid, b"x")
    await runtime.signal_process(session.id, T, pid, "TERM")
    assert [e async for e in closed][-1] == Exited(-1, False, "signal: terminated")


async def test_a_process_dies_at_the_end_of_its_timeout(
    runtime: LocalSandboxes, session: ExecSession
) -> None:
    started = time.monotonic()
    events = await run(runtime, session, bash("sleep 20", timeout=0.5))
    end = events[-1]
    assert isinstance(end, Exited) and not end.exited and end.error
    assert time.monotonic() - started < 5


async def test_a_process_runs_while_a_call_runs(
    runtime: LocalSandboxes, session: ExecSession
) -> None:
    cell = asyncio.ensure_future(
        runtime.execute(
            session.id, T, PythonCall("import time; time.sleep(1.5); print('cell')"), 20
        )
    )
    await asyncio.sleep(0.2)
    started = time.monotonic()
    events = await run(runtime, session, bash("echo beside"))
    assert time.monotonic() - started < 1.0 and not cell.done()
    assert (await cell).stdout == "cell\n"
    assert events[-1] == Exited(0, True, "exit status 0")


async def test_processes_asked_for_at_once_on_a_fresh_session_all_run(
    runtime: LocalSandboxes, session: ExecSession
) -> None:
    # The first requests open the worker's interrupt channel for services, all at once.
    runs = await asyncio.gather(*(run(runtime, session, bash(f"echo p{i}")) for i in range(6)))
    for i, events in enumerate(runs):
        assert ProcessOutput("stdout", f"p{i}\n".encode()) in events
        assert events[-1] == Exited(0, True, "exit status 0")


async def test_environment_and_directory(runtime: LocalSandboxes, session: ExecSession) -> None:
    await runtime.make_dir(session.id, T, "sub")
    spec = bash("echo $ONE; pwd", envs={"ONE": "1"}, cwd="sub")  # relative: the workspace's
    events = await run(runtime, session, spec)
    out = b"".join(e.data for e in events if isinstance(e, ProcessOutput)).decode()
    assert out.startswith("1\n") and out.endswith("/sub\n")
    with pytest.raises(BadRequest):
        await run(runtime, session, bash("true", cwd="/nowhere"))


async def test_the_tree(runtime: LocalSandboxes, session: ExecSession) -> None:
    made = await runtime.make_dir(session.id, T, "a/b")
    assert made.kind == "dir" and made.path == "a/b" and made.owner == "user"
    with pytest.raises(AlreadyExists):
        await runtime.make_dir(session.id, T, "a/b")
    await runtime.execute(
        session.id,
        T,
        PythonCall(
            "open('a/b/f.txt', 'w').write('xy'); import os; os.symlink('/etc/passwd', 'a/link')"
        ),
        20,
    )
    listed = {e.path: e for e in await runtime.list_tree(session.id, T, "a", 3)}
    assert set(listed) == {"a/b", "a/b/f.txt", "a/link"}
    assert listed["a/link"].kind == "symlink" and listed["a/link"].target == "/etc/passwd"
    assert (await runtime.stat(session.id, T, "a/b/f.txt")).size == 2
    with pytest.raises(PathEscape):  # never through a link
        await runtime.list_tree(session.id, T, "a/link", 1)
    moved = await runtime.move(session.id, T, "a/b/f.txt", "c/g.txt")
    assert moved.path == "c/g.txt"
    await runtime.remove(session.id, T, "a")
    await runtime.remove(session.id, T, "a")  # not there: fine
    with pytest.raises(NotFound):
        await runtime.stat(session.id, T, "a")
    r = await runtime.execute(
        session.id, T, PythonCall("import os; print(os.path.exists('/etc/passwd'))"), 20
    )
    assert r.stdout == "True\n"  # the link was removed, not what it named


async def test_a_watch_sees_changes(runtime: LocalSandboxes, session: ExecSession) -> None:
    await runtime.make_dir(session.id, T, "w")
    changes = await runtime.watch(session.id, T, "w", True)
    seen: list[FsChange] = []

    async def collect() -> None:
        async for change in changes:
            seen.append(change)

    task = asyncio.ensure_future(collect())
    try:
        await runtime.execute(session.id, T, PythonCall("import os; os.makedirs('w/d')"), 20)
        # A new directory is watched once its creation is seen (inotify's way, E2B's too): a
        # file made and removed in it before then is not seen (it flaked here 1 run in 14).
        for _ in range(50):
            if FsChange("d", "create") in seen:
                break
            await asyncio.sleep(0.02)
        code = "open('w/d/f', 'w').write('x'); import os; os.remove('w/d/f')"
        await runtime.execute(session.id, T, PythonCall(code), 20)
        for _ in range(50):
            if FsChange("d/f", "remove") in seen:
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert FsChange("d", "create") in seen and FsChange("d/f", "write") in seen
    assert FsChange("d/f", "remove") in seen
    with pytest.raises(NotFound):
        await runtime.watch(session.id, T, "nowhere", False)


async def test_contexts_and_notebook_calls(runtime: LocalSandboxes, session: ExecSession) -> None:
    def nb(code: str, context: str | None = None, **envs: str) -> PythonCall:
        return PythonCall(code, context=context, envs=envs or None, notebook=True)

    r = await runtime.execute(session.id, T, nb("x = 1\nx + 1"), 20)
    assert r.main == {"data": {"text/plain": "2"}} and r.stdout == "" and r.execution_count == 1
    r = await runtime.execute(session.id, T, nb("1/0"), 20)
    assert r.error is not None and r.error.name == "ZeroDivisionError" and r.stderr == ""
    home = (await runtime.execute(session.id, T, nb("import os\nos.getcwd()"), 20)).main
    ctx = await runtime.create_context(session.id, T, "/tmp")
    r = await runtime.execute(session.id, T, nb("import os\nx = 'ctx'\nos.getcwd()", ctx.id), 20)
    assert r.main == {"data": {"text/plain": "'/tmp'"}} and r.execution_count == 1
    r = await runtime.execute(session.id, T, nb("import os\nx, os.environ.get('E')", E="e"), 20)
    assert r.main == {"data": {"text/plain": "(1, 'e')"}}
    # The main namespace's directory is its own, the call's variables gone.
    assert (await runtime.execute(session.id, T, nb("os.getcwd()"), 20)).main == home
    r = await runtime.execute(session.id, T, PythonCall("print(os.environ.get('E'))"), 20)
    assert r.stdout == "None\n"
    await runtime.restart_context(session.id, T, ctx.id)
    r = await runtime.execute(session.id, T, nb("'x' in dir()", ctx.id), 20)
    assert r.main == {"data": {"text/plain": "False"}}
    await runtime.remove_context(session.id, T, ctx.id)
    with pytest.raises(NotFound):
        await runtime.execute(session.id, T, nb("1", ctx.id), 20)
