"""The real E2B Python SDK (`e2b-code-interpreter`, unchanged) against a server and a fleet."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2b_code_interpreter import Sandbox

from e2b import (
    AuthenticationException,
    CommandExitException,
    FilesystemEventType,
    FileType,
    NotFoundException,
    SandboxQuery,
    TimeoutException,
)
from tests.e2b.conftest import KEY_B, Target


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


def test_an_exception_is_the_execution_s_error(sbx: Sandbox) -> None:
    execution = sbx.run_code("def f():\n    raise ValueError('boom')\nf()")
    assert execution.error is not None
    assert execution.error.name == "ValueError" and execution.error.value == "boom"
    assert "ValueError" in execution.error.traceback
    assert execution.logs.stderr == []  # the traceback is the error's, not stderr's


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
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    assert sbx.run_code("'y' in dir()", context=ctx).text == "False"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]


def test_another_language_is_refused_as_e2b_refuses_it(sbx: Sandbox) -> None:
    with pytest.raises(Exception, match="kernel is not available"):
        sbx.run_code("puts 1", language="ruby")


def test_files_write_read_list_make_dir_remove(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/data/a.txt", "hello")
    assert info.path == "/home/user/data/a.txt"
    assert sbx.files.read("/home/user/data/a.txt") == "hello"
    assert sbx.files.read("data/a.txt", format="bytes") == bytearray(b"hello")
    sbx.files.write_files([{"path": "data/sub/c.txt", "data": "c"}])
    entries = {e.name: e for e in sbx.files.list("/home/user/data")}
    assert set(entries) == {"a.txt", "sub"} and entries["sub"].type == FileType.DIR
    assert "c.txt" in [e.name for e in sbx.files.list("/home/user/data", depth=2)]
    assert sbx.files.get_info("data/a.txt").size == 5
    assert sbx.files.make_dir("/home/user/made") is True
    assert sbx.files.make_dir("/home/user/made") is False
    sbx.files.rename("data/a.txt", "data/b.txt")
    assert sbx.files.exists("data/b.txt") and not sbx.files.exists("data/a.txt")
    sbx.files.remove("data/b.txt")
    assert not sbx.files.exists("data/b.txt")
    with pytest.raises(NotFoundException):
        sbx.files.read("/home/user/missing.txt")
    # The code sees what the files API wrote, at the same path.
    assert sbx.run_code("open('/home/user/data/sub/c.txt').read()").text == "c"


def test_files_outside_the_home_are_refused(sbx: Sandbox) -> None:
    with pytest.raises(Exception, match="outside /home/user"):
        sbx.files.read("/etc/passwd")


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


def test_list_info_set_timeout(sbx: Sandbox) -> None:
    sbx.set_timeout(600)
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id and info.metadata["who"] == "the py suite"
    assert 500 < (info.end_at - info.started_at).total_seconds() < 700 + 60
    other = Sandbox.create(metadata={"suite": "py", "who": "other"})
    try:
        pager = Sandbox.list(query=SandboxQuery(metadata={"suite": "py"}), limit=1)
        ids: list[str] = []
        while pager.has_next:
            ids += [s.sandbox_id for s in pager.next_items()]
        assert sorted(ids) == sorted([sbx.sandbox_id, other.sandbox_id])
        only = Sandbox.list(query=SandboxQuery(metadata={"who": "the py suite"})).next_items()
        assert [s.sandbox_id for s in only] == [sbx.sandbox_id]
    finally:
        other.kill()


def test_connect_to_a_running_sandbox_keeps_its_variables(sbx: Sandbox) -> None:
    sbx.run_code("kept = 'still here'")
    assert Sandbox.connect(sbx.sandbox_id).run_code("kept").text == "still here"


def test_pause_is_refused_until_it_is_supported(sbx: Sandbox) -> None:
    with pytest.raises(Exception, match="not supported"):
        sbx.pause()
    assert sbx.run_code("1 + 1").text == "2"


def test_a_second_key_sees_nothing_of_the_first_s(sbx: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, api_key=KEY_B)
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list(api_key=KEY_B).next_items()]
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-a-key-of-this-server")


def test_kill(sdk_env: Target) -> None:
    sandbox = Sandbox.create()
    assert sandbox.is_running()
    assert sandbox.kill() is True
    assert Sandbox.kill(sandbox.sandbox_id) is False
    assert sandbox.is_running() is False
