"""The persistent shell and the text editor."""

from __future__ import annotations

import pytest

from sandbank.sandbox.backends.base import INTERPRETERS, ISOLATION
from tests.sandbox.conftest import Shell

pytestmark = [pytest.mark.anyio, pytest.mark.claims(INTERPRETERS)]


@pytest.mark.claims(ISOLATION)  # /workspace exists in a root of its own only
async def test_cd_exports_and_functions_persist(sb: Shell) -> None:
    r = await sb.sh(
        'mkdir -p sub && cd sub && export GREETING=hi && greet() { echo "$GREETING $1"; }'
    )
    assert r.return_code == 0, r.stderr
    r = await sb.sh("pwd; greet there")
    assert r.stdout == "/workspace/sub\nhi there\n"


async def test_streams_and_exit_status(sb: Shell) -> None:
    r = await sb.sh("echo out; echo err >&2; false")
    assert (r.stdout, r.stderr, r.return_code) == ("out\n", "err\n", 1)
    r = await sb.sh("cat")  # stdin is /dev/null, never the control channel
    assert r.return_code == 0 and r.stdout == ""


@pytest.mark.claims(ISOLATION)  # /workspace exists in a root of its own only
async def test_exit_ends_the_shell_and_the_next_call_gets_a_new_one(sb: Shell) -> None:
    await sb.sh("cd /tmp")
    r = await sb.sh("echo bye; echo oops >&2; exit 7")
    assert (r.stdout, r.stderr, r.return_code) == ("bye\n", "oops\n", 7)  # nothing lost
    r = await sb.sh("pwd")
    assert (r.stdout, r.return_code) == ("/workspace\n", 0)


async def test_bash_reports_produced_files(sb: Shell) -> None:
    r = await sb.sh("mkdir -p d && echo 1 > d/one.txt && echo 2 > two.txt")
    assert r.files == ["d/one.txt", "two.txt"]


async def test_shell_and_python_share_the_workspace(sb: Shell) -> None:
    await sb.sh("echo shared > s.txt")
    assert (await sb.py("print(open('s.txt').read().strip())")).stdout == "shared\n"


@pytest.mark.claims(ISOLATION)  # /workspace exists in a root of its own only
async def test_editor_create_view_replace_insert_undo(sb: Shell) -> None:
    r = await sb.edit(command="create", path="notes/a.py", file_text="one\ntwo\nthree\n")
    assert r.return_code == 0 and r.files == []
    r = await sb.edit(command="view", path="/workspace/notes/a.py")
    assert r.stdout == "     1\tone\n     2\ttwo\n     3\tthree\n"
    r = await sb.edit(command="view", path="notes/a.py", view_range=(2, -1))
    assert r.stdout == "     2\ttwo\n     3\tthree\n"
    r = await sb.edit(command="str_replace", path="notes/a.py", old_str="two", new_str="TWO")
    assert r.return_code == 0 and "TWO" in r.stdout
    r = await sb.edit(command="insert", path="notes/a.py", insert_line=0, new_str="zero")
    assert r.return_code == 0
    assert (await sb.sh("cat notes/a.py")).stdout == "zero\none\nTWO\nthree\n"
    assert (await sb.edit(command="undo_edit", path="notes/a.py")).return_code == 0
    assert (await sb.sh("cat notes/a.py")).stdout == "one\nTWO\nthree\n"
    assert (await sb.edit(command="undo_edit", path="notes/a.py")).return_code == 0
    assert (await sb.sh("cat notes/a.py")).stdout == "one\ntwo\nthree\n"
    r = await sb.edit(command="undo_edit", path="notes/a.py")
    assert r.return_code == 1 and "no edit history" in r.stderr


async def test_editor_failures_are_results_with_clear_stderr(sb: Shell) -> None:
    await sb.edit(command="create", path="dup.txt", file_text="x\nx\n")
    r = await sb.edit(command="str_replace", path="dup.txt", old_str="x", new_str="y")
    assert r.return_code == 1 and "appears 2 times" in r.stderr
    r = await sb.edit(command="str_replace", path="dup.txt", old_str="nope", new_str="y")
    assert r.return_code == 1 and "did not appear" in r.stderr
    r = await sb.edit(command="view", path="missing.txt")
    assert r.return_code == 1 and "does not exist" in r.stderr
    r = await sb.edit(command="view", path="dup.txt", view_range=(5, 9))
    assert r.return_code == 1 and "view_range" in r.stderr
    r = await sb.edit(command="insert", path="dup.txt", insert_line=99, new_str="z")
    assert r.return_code == 1 and "insert_line" in r.stderr


async def test_editor_refuses_paths_outside_the_workspace(sb: Shell) -> None:
    for path in ("/etc/passwd", "../etc/passwd", "/workspace/../etc/hostname"):
        r = await sb.edit(command="view", path=path)
        assert r.return_code == 1 and "outside the workspace" in r.stderr, path
    await sb.sh("ln -sf /etc link")
    r = await sb.edit(command="create", path="link/evil", file_text="x")
    assert r.return_code == 1 and "outside the workspace" in r.stderr
