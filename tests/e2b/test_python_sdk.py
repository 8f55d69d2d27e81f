"""The real E2B Python SDK (`e2b-code-interpreter`, unchanged) against a server and a fleet, for
what runs code in real sandboxes: cells, charts, contexts, commands, watching files. The control
plane, the files API and the refusals are driven by the same SDK over fakes in
test_python_sdk_http.py."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2b_code_interpreter import Sandbox

from e2b import (
    CommandExitException,
    FilesystemEventType,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from tests.e2b.conftest import Target


@pytest.fixture(scope="module")
def sbx(sdk_env: Target) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(
        metadata={"suite": "py", "who": "the py suite"}, envs={"SB_GLOBAL": "g1"}
    )
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_state_survives_across_run_code(sbx: Sandbox) -> None:
    first = sbx.run_code("x = 41\nx + 1")
    assert first.text == "42" and first.results[0].is_main_result
    assert sbx.run_code("x * 2").text == "82"
    assert sbx.run_code("x").execution_count > first.execution_count


def test_stdout_and_stderr_arrive_while_the_code_runs(sbx: Sandbox) -> None:
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    execution = sbx.run_code(
        "import sys, time\nfor i in range(3):\n    print('tick', i, flush=True)\n"
        "    print('tock', i, file=sys.stderr, flush=True)\n    time.sleep(0.4)\n",
        on_stdout=lambda m: seen.append((time.monotonic() - started, m.line)),
        on_stderr=lambda m: seen.append((time.monotonic() - started, "E" + m.line)),
    )
    assert "".join(execution.logs.stdout) == "tick 0\ntick 1\ntick 2\n"
    assert "".join(execution.logs.stderr) == "tock 0\ntock 1\ntock 2\n"
    # Streamed: the first line came long before the last (the cell takes 1.2 s).
    assert seen[-1][0] - seen[0][0] > 0.6


def test_a_matplotlib_chart_comes_as_png(sbx: Sandbox) -> None:
    execution = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    pngs = [r.png for r in execution.results if r.png]
    assert len(pngs) == 1 and base64.b64decode(pngs[0])[:4] == b"\x89PNG"
    assert execution.error is None


def test_a_dataframe_comes_as_html(sbx: Sandbox) -> None:
    execution = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    main = execution.results[0]
    assert main.is_main_result and "<table" in (main.html or "") and "text" in main.formats()


def test_envs_of_the_sandbox_and_of_a_call(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "import os\nos.environ.get('SB_GLOBAL'), os.environ.get('ONCE')", envs={"ONCE": "1"}
    )
    assert execution.text == "('g1', '1')"
    assert sbx.run_code("import os\nos.environ.get('ONCE')").text is None


def test_contexts_keep_their_own_state(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context()
    sbx.run_code("y = 'in ctx'", context=ctx)
    assert sbx.run_code("y", context=ctx).text == "in ctx"
    assert sbx.run_code("'y' in dir()").text == "False"
    sbx.restart_code_context(ctx)
    assert sbx.run_code("'y' in dir()", context=ctx).text == "False"
    sbx.remove_code_context(ctx)


def test_the_code_sees_what_the_files_api_wrote(sbx: Sandbox) -> None:
    """At the same path, in the sandbox's home (test_python_sdk_http.py has the files API's
    calls themselves)."""
    sbx.files.write_files([{"path": "data/sub/c.txt", "data": "c"}])
    assert sbx.run_code("open('/home/user/data/sub/c.txt').read()").text == "c"
    sbx.files.write("/home/user/data/a.txt", "hello")
    assert sbx.run_code("open('data/a.txt').read()").text == "hello"


def test_watch_dir_sees_a_write(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/watched")
    handle = sbx.files.watch_dir("/home/user/watched")
    try:
        sbx.files.write("/home/user/watched/new.txt", "w")
        deadline = time.monotonic() + 5
        events: list[Any] = []
        while time.monotonic() < deadline and not any(e.name == "new.txt" for e in events):
            time.sleep(0.1)
            events += handle.get_new_events()
    finally:
        handle.stop()
    kinds = {e.type for e in events if e.name == "new.txt"}
    assert FilesystemEventType.CREATE in kinds and FilesystemEventType.WRITE in kinds


def test_commands_in_the_foreground(sbx: Sandbox) -> None:
    out: list[str] = []
    result = sbx.commands.run(
        "echo hi; echo oops >&2; echo $SB_GLOBAL $MINE; pwd",
        envs={"MINE": "m"},
        on_stdout=out.append,
    )
    assert result.exit_code == 0 and result.stderr == "oops\n"
    assert result.stdout == "hi\ng1 m\n/home/user\n" and "".join(out) == result.stdout
    assert sbx.commands.run("pwd", cwd="/home/user/data").stdout == "/home/user/data\n"
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo before; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "before\n"


def test_commands_in_the_background(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 30", background=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(99999) is False
    fed = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
    sbx.commands.send_stdin(fed.pid, "abc\n")
    assert fed.wait().stdout == "got:abc\n"
    late = sbx.commands.run("sleep 0.3; echo late", background=True)
    assert sbx.commands.connect(late.pid).wait().stdout == "late\n"


def test_a_command_runs_while_a_cell_runs(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 0.5; echo side", background=True)
    execution = sbx.run_code("import time; time.sleep(1); 'cell'")
    assert execution.text == "cell" and handle.wait().stdout == "side\n"


def test_a_command_past_its_timeout_is_a_timeout(sbx: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 10", timeout=1)


def test_pause_then_connect_resumes_with_the_variables(sdk_env: Target) -> None:
    sandbox = Sandbox.create(metadata={"suite": "pause"})
    try:
        sandbox.run_code("kept = sum(range(10))")
        assert sandbox.pause() is True
        assert Sandbox.pause(sandbox.sandbox_id) is False  # already paused: E2B's 409
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert sandbox.sandbox_id in [s.sandbox_id for s in paused]
        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
        assert sandbox.sandbox_id not in [s.sandbox_id for s in running]
        again = Sandbox.connect(sandbox.sandbox_id)
        assert again.run_code("kept").text == "45"
        assert again.get_info().state == SandboxState.RUNNING
    finally:
        sandbox.kill()
