"""The everyday commands: users, keys and sessions listed; `sandbank exec`.

The admin commands and `sandbank exec` run in-process against the app over fakes, served by
uvicorn on loopback (tests/fakeapp.py), whose sandboxes remember `NAME = N`; what needs the real
process (its log, a port in use) runs the command against a real server.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest

from sandbank import cli
from sandbank.protocol.calls import ExecResult, PythonCall, ToolCall
from sandbank.startup import version
from tests import support
from tests.fakeapp import FakeApp, canned
from tests.interpreter.harness import Client
from tests.support import SANDBANK, data_dir, free_port

ADMIN = "admin-token-for-tests"


class Fake:
    """The app over fakes as these tests see a server: URL, data, environment, users, commands."""

    def __init__(self, app: FakeApp, url: str) -> None:
        self.app, self.url, self.data = app, url, app.dir
        self.env = {"SANDBANK_DATA_DIR": str(app.dir), "SANDBANK_ADMIN_TOKEN": ADMIN}

    def new_user(self) -> Client:
        name, key = self.app.new_user()
        return Client(self.url, key, name)

    def run(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`sandbank ARGS` in-process, with this environment; its code and output."""
        out, err = io.StringIO(), io.StringIO()
        with (
            mock.patch.dict(os.environ, env if env is not None else self.env),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            code = cli.main(list(args))
        return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())

    def cli(self, *args: str) -> str:
        done = self.run(*args, "--data-dir", str(self.data))
        assert done.returncode == 0, done.stderr
        return done.stdout


_ASSIGN = re.compile(r"(\w+) = (\d+)")
_PLUS_ONE = re.compile(r"(\w+) \+ 1")


async def remembering(call: ToolCall, workspace: Path) -> ExecResult:
    """`NAME = N` keeps N in the sandbox and `NAME + 1` shows N + 1; bash's `echo T >&2; exit C`
    and Python's `sys.exit(C)` end as they say; the rest is canned."""
    text = call.code if isinstance(call, PythonCall) else getattr(call, "command", "")
    if isinstance(call, PythonCall) and (assigned := _ASSIGN.fullmatch(call.code)):
        (workspace / f".{assigned.group(1)}").write_text(assigned.group(2))
        return ExecResult()
    if isinstance(call, PythonCall) and (plus := _PLUS_ONE.fullmatch(call.code)):
        return ExecResult(stdout=f"{int((workspace / f'.{plus.group(1)}').read_text()) + 1}\n")
    if failed := re.fullmatch(r"echo (\w+) >&2; exit (\d+)", text):
        return ExecResult(stderr=f"{failed.group(1)}\n", return_code=int(failed.group(2)))
    if exited := re.search(r"sys\.exit\((\d+)\)", text):
        return ExecResult(return_code=int(exited.group(1)))
    return await canned(call, workspace)


@pytest.fixture(scope="module")
def fake() -> Iterator[Fake]:
    app = FakeApp(remembering, admin_token=ADMIN)
    with app.serving() as url:
        yield Fake(app, url)


def test_users_are_listed_with_their_keys(fake: Fake) -> None:
    server = fake
    name = f"lister{uuid.uuid4().hex[:6]}"
    server.cli("users", "create", name)
    header, *rows = server.cli("users", "list").splitlines()
    assert header.split() == ["NAME", "ID", "CREATED", "ACTIVE_KEYS"]
    mine = next(row.split() for row in rows if row.split()[0] == name)
    assert mine[-1] == "1"


@pytest.mark.parametrize("name", ["", "   ", "a/b", "x y", "tab\there"])
def test_bad_user_names_are_refused(fake: Fake, name: str) -> None:
    done = fake.run("users", "create", name, "--data-dir", str(fake.data))
    assert done.returncode == 1
    assert done.stderr.startswith(f"sandbank: user name {name!r} is not valid")
    assert "Traceback" not in done.stderr


def test_keys_are_listed_with_a_header_creation_and_last_use(fake: Fake) -> None:
    server = fake
    with server.new_user() as carol:
        header, row = server.cli("keys", "list", carol.name).splitlines()
        carol.ok("GET", "/api/sessions")
        deadline = time.monotonic() + 10  # written just after the request is answered
        while (used := server.cli("keys", "list", carol.name).splitlines()[1]).endswith(
            "never active"
        ) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert header.split() == ["KEY_ID", "USER", "CREATED", "LAST_USED", "STATE"]
    _key_id, user, day, clock, last_used, state = row.split()
    assert user == carol.name and (last_used, state) == ("never", "active")
    assert len(day) == 10 and len(clock) == 8
    _key_id, _user, _day, _clock, used_day, used_clock, state = used.split()
    assert state == "active" and (used_day, used_clock) >= (day, clock)


def test_sessions_are_listed_newest_first_with_a_title(fake: Fake) -> None:
    server = fake
    with server.new_user() as dan:
        older = dan.new_session()
        dan.ask(older, "Say hello please, in a long sentence that goes on and on beyond the width")
        dan.wait(older)
        newer = dan.new_session()
        header, *rows = server.cli("sessions", "list", dan.name).splitlines()
    assert header.split() == ["SESSION_ID", "USER", "CREATED", "STATUS", "TITLE"]
    assert [r.split()[0] for r in rows] == [newer, older]
    assert rows[0].endswith("(no question yet)")
    assert "DONE" in rows[1] and "Say hello please, in a long sentence" in rows[1]
    assert rows[1].endswith("…")


def test_exec_prints_the_output_and_exits_with_the_return_code(fake: Fake) -> None:
    done = fake.run("exec", "--url", fake.url, "-c", "print(42)")
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr
    done = fake.run("exec", "--url", fake.url, "-b", "echo oops >&2; exit 4")
    assert (done.returncode, done.stdout, done.stderr) == (4, "", "oops\n")
    with mock.patch("sys.stdin", io.StringIO("import sys\nsys.exit(3)\n")):
        done = fake.run("exec", "--url", fake.url)
    assert done.returncode == 3


def test_exec_can_keep_a_session_and_come_back_to_it(fake: Fake) -> None:
    done = fake.run("exec", "--url", fake.url, "--keep", "-c", "x = 41")
    assert done.returncode == 0, done.stderr
    session = done.stderr.strip().removeprefix("[session] ")
    done = fake.run("exec", "--url", fake.url, "--session", session, "-c", "x + 1")
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr


def test_exec_takes_the_session_as_one_argument_too(fake: Fake) -> None:
    done = fake.run("exec", "--url", fake.url, "--keep", "-c", "y = 1")
    session = done.stderr.strip().removeprefix("[session] ")
    assert not session.startswith("-")
    done = fake.run("exec", "--url", fake.url, f"--session={session}", "-c", "y + 1")
    assert (done.returncode, done.stdout) == (0, "2\n"), done.stderr


def test_exec_says_a_session_ended_with_a_server_restart() -> None:
    """The server is the app over fakes, served on one port, then served again (a new process
    would be a new instance: sessions live in its memory)."""
    port = free_port()
    first = FakeApp(remembering, admin_token=ADMIN)
    with first.serving(port) as url:
        done = Fake(first, url).run("exec", "--url", url, "--keep", "-c", "z = 1")
        session = done.stderr.strip().removeprefix("[session] ")
    again = FakeApp(remembering, admin_token=ADMIN)
    with again.serving(port) as url:
        done = Fake(again, url).run("exec", "--url", url, f"--session={session}", "-c", "z + 1")
    assert done.returncode == 1
    assert done.stderr == (
        f"sandbank: running the code failed: session {session!r} ended when the server "
        "restarted, and no snapshot of it was kept (it was running when the server stopped "
        "without pausing it, and never checkpointed): create a new session and run your code "
        "again\n"
    )


def test_exec_says_when_the_server_cannot_be_reached(fake: Fake) -> None:
    done = fake.run("exec", "--url", "http://127.0.0.1:9", "-c", "1")
    assert done.returncode == 1
    assert done.stderr.startswith("sandbank: cannot reach the server at http://127.0.0.1:9")


def test_a_servers_exec_sessions_are_listed_with_the_admin_token(fake: Fake) -> None:
    server = fake
    sid = httpx.post(server.url + "/sessions", json={}).json()["session_id"]
    try:
        assert httpx.get(server.url + "/admin/sessions").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.get(server.url + "/admin/sessions", headers=wrong).status_code == 401
        done = fake.run("sessions", "list", "--exec", "--url", server.url)
        assert done.returncode == 0, done.stderr
        header, *rows = done.stdout.splitlines()
        assert header.split() == ["SESSION", "TENANT", "CREATED", "STATE", "IDLE"]
        mine = [r for r in rows if r.startswith(sid[:14] + "…")]
        assert len(mine) == 1 and " idle " in mine[0]
        assert sid not in done.stdout  # a prefix only: the listing grants no access
    finally:
        httpx.delete(f"{server.url}/sessions/{sid}")
    env = {k: v for k, v in server.env.items() if k != "SANDBANK_ADMIN_TOKEN"}
    refused = fake.run("sessions", "list", "--exec", "--url", server.url, env=env)
    assert refused.returncode == 1
    assert "needs its admin token" in refused.stderr


def test_serve_logs_its_role_and_a_port_in_use_is_one_line(machine: None) -> None:
    with data_dir() as first_dir, data_dir() as second_dir:
        first = support.Server(first_dir, isolation="none").start()
        try:
            log = first.log.read_text()
            assert f"sandbank {version()}: single server on http://127.0.0.1:{first.port}" in log
            env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBANK_")}
            done = subprocess.run(
                [SANDBANK, "serve", "--port", str(first.port), "--data-dir", str(second_dir)],
                env={**env, "SANDBANK_ISOLATION": "none"},
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            first.stop()
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        f"sandbank: 127.0.0.1:{first.port} is already in use (another sandbank server, or "
        "another program): stop it, or choose another port with --port or SANDBANK_PORT"
    )
    assert "Traceback" not in done.stderr
