"""The real E2B Python SDK (`e2b-code-interpreter`, unchanged) against the app over fakes: the
control plane, the files API and the refusals, as the SDK reads them.

The app runs in this process on the fake backend, served on loopback with the listener
`sandbank serve` uses (tests/fakeapp.py); the SDK finds it through its own settings.
test_python_sdk.py drives real sandboxes, on a server and through a fleet, for what runs code.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from e2b_code_interpreter import Sandbox

from e2b import (
    AuthenticationException,
    FileType,
    NotFoundException,
    SandboxQuery,
)
from sandbank.protocol.calls import CellError, ExecResult, PythonCall, ToolCall
from tests.e2b.conftest import KEY_A, KEY_B, LIMITS, Target
from tests.fakeapp import FakeApp, canned

_KEEP = re.compile(r"(\w+) = '([^']*)'")


async def answer(call: ToolCall, workspace: Path) -> ExecResult:
    """`1 + 1` is 2, as the kernel's main result; `f()` raises ValueError; `NAME = 'text'` keeps the text in the sandbox
    and `NAME` shows it; the rest is canned."""
    if isinstance(call, PythonCall) and call.code == "1 + 1":
        return ExecResult(main={"data": {"text/plain": "2"}})
    if isinstance(call, PythonCall) and call.code == "f()":  # as a kernel reports an exception
        trace = "Traceback (most recent call last):\n  ...\nValueError: boom"
        return ExecResult(return_code=1, error=CellError("ValueError", "boom", trace))
    if isinstance(call, PythonCall) and (kept := _KEEP.fullmatch(call.code)):
        (workspace / f".{kept.group(1)}").write_text(kept.group(2))
        return ExecResult()
    if isinstance(call, PythonCall) and (workspace / f".{call.code}").is_file():
        return ExecResult(main={"data": {"text/plain": (workspace / f".{call.code}").read_text()}})
    return await canned(call, workspace)


@pytest.fixture(scope="module")
def sdk_env() -> Iterator[Target]:
    """The app over fakes, and the Python SDK's settings pointing at it."""
    fake = FakeApp(answer, exec_tokens=LIMITS["exec_tokens"])
    with fake.serving() as url:
        target = Target("fake", url)
        with mock.patch.dict(os.environ, target.env(KEY_A)):
            yield target


@pytest.fixture(scope="module")
def sbx(sdk_env: Target) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(
        metadata={"suite": "py", "who": "the py suite"}, envs={"SB_GLOBAL": "g1"}
    )
    try:
        yield sandbox
    finally:
        sandbox.kill()


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


def test_another_language_is_refused_as_e2b_refuses_it(sbx: Sandbox) -> None:
    with pytest.raises(Exception, match="kernel is not available"):
        sbx.run_code("puts 1", language="ruby")


def test_files_outside_the_home_are_refused(sbx: Sandbox) -> None:
    with pytest.raises(Exception, match="outside /home/user"):
        sbx.files.read("/etc/passwd")


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


def test_pause_on_an_isolation_that_keeps_no_snapshots_is_refused(sbx: Sandbox) -> None:
    with pytest.raises(Exception, match="cannot be paused"):
        sbx.pause()
    assert sbx.run_code("1 + 1").text == "2"  # and it goes on


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


def test_contexts_are_created_listed_restarted_and_removed(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context()
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]


def test_connect_to_a_running_sandbox_reaches_the_same_one(sbx: Sandbox) -> None:
    sbx.run_code("kept = 'still here'")
    assert Sandbox.connect(sbx.sandbox_id).run_code("kept").text == "still here"


def test_an_exception_is_the_execution_s_error(sbx: Sandbox) -> None:
    """The error as the SDK reads it (tests/sandbox/test_background.py has a real kernel's
    exception as the call's error, its stderr empty)."""
    execution = sbx.run_code("f()")
    assert execution.error is not None
    assert execution.error.name == "ValueError" and execution.error.value == "boom"
    assert "ValueError" in execution.error.traceback
    assert execution.logs.stderr == []  # the traceback is the error's, not stderr's
