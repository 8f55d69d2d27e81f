"""The everyday commands against a real server: users, keys and sessions listed; `sandbank exec`."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Server, openai_env, running
from tests.support import SANDBANK
from tests.tiers import needs

ADMIN = "admin-token-for-tests"


@pytest.fixture(scope="module")
@needs("root")
def server(llm: FakeLLM) -> Iterator[Server]:
    with running({**openai_env(llm.url), "SANDBANK_ADMIN_TOKEN": ADMIN}) as s:
        yield s


def sandbank(server: Server, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDBANK, *args],
        env=server.env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_users_are_listed_with_their_keys(server: Server) -> None:
    name = f"lister{uuid.uuid4().hex[:6]}"
    server.cli("users", "create", name)
    header, *rows = server.cli("users", "list").splitlines()
    assert header.split() == ["NAME", "ID", "CREATED", "ACTIVE_KEYS"]
    mine = next(row.split() for row in rows if row.split()[0] == name)
    assert mine[-1] == "1"


@pytest.mark.parametrize("name", ["", "   ", "a/b", "x y", "tab\there"])
def test_bad_user_names_are_refused(server: Server, name: str) -> None:
    done = sandbank(server, "users", "create", name, "--data-dir", str(server.data))
    assert done.returncode == 1
    assert done.stderr.startswith(f"sandbank: user name {name!r} is not valid")
    assert "Traceback" not in done.stderr


def test_keys_are_listed_with_a_header_creation_and_last_use(server: Server) -> None:
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


def test_sessions_are_listed_newest_first_with_a_title(server: Server) -> None:
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


def test_exec_prints_the_output_and_exits_with_the_return_code(server: Server) -> None:
    done = sandbank(server, "exec", "--url", server.url, "-c", "print(6 * 7)")
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr
    done = sandbank(server, "exec", "--url", server.url, "-b", "echo oops >&2; exit 4")
    assert (done.returncode, done.stdout, done.stderr) == (4, "", "oops\n")
    done = sandbank(server, "exec", "--url", server.url, stdin="import sys\nsys.exit(3)\n")
    assert done.returncode == 3


def test_exec_can_keep_a_session_and_come_back_to_it(server: Server) -> None:
    done = sandbank(server, "exec", "--url", server.url, "--keep", "-c", "x = 41")
    assert done.returncode == 0, done.stderr
    session = done.stderr.strip().removeprefix("[session] ")
    done = sandbank(server, "exec", "--url", server.url, "--session", session, "-c", "x + 1")
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr


def test_exec_says_when_the_server_cannot_be_reached(server: Server) -> None:
    done = sandbank(server, "exec", "--url", "http://127.0.0.1:9", "-c", "1")
    assert done.returncode == 1
    assert done.stderr.startswith("sandbank: cannot reach the server at http://127.0.0.1:9")


def test_a_servers_exec_sessions_are_listed_with_the_admin_token(server: Server) -> None:
    sid = httpx.post(server.url + "/sessions", json={}).json()["session_id"]
    try:
        assert httpx.get(server.url + "/admin/sessions").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.get(server.url + "/admin/sessions", headers=wrong).status_code == 401
        done = sandbank(server, "sessions", "list", "--exec", "--url", server.url)
        assert done.returncode == 0, done.stderr
        header, *rows = done.stdout.splitlines()
        assert header.split() == ["SESSION", "TENANT", "CREATED", "STATE", "IDLE"]
        mine = [r for r in rows if r.startswith(sid[:8] + "…")]
        assert len(mine) == 1 and " idle " in mine[0]
        assert sid not in done.stdout  # a prefix only: the listing grants no access
    finally:
        httpx.delete(f"{server.url}/sessions/{sid}")
    env = {k: v for k, v in server.env.items() if k != "SANDBANK_ADMIN_TOKEN"}
    refused = subprocess.run(
        [SANDBANK, "sessions", "list", "--exec", "--url", server.url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert "needs its admin token" in refused.stderr
