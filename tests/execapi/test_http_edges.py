"""The code-execution API's edges over fakes: hostile bodies, caps, OPTIONS/405, odd names.

Files are planted straight into the fake sandbox's workspace (a real directory), so what is
tested is how the server lists and serves them (links, pipes and long directories are
test_http_contract.py's, for a server and a fleet); test_hostile.py and test_conformance.py keep
what needs code that really runs (names a program made, a disk out of inodes, loop devices).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from tests.execapi.conftest import Contract, run
from tests.fakeapp import FakeApp


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeApp]:
    made = FakeApp(max_sessions=8, exec_timeout_default=30, exec_timeout_max=30)
    with made.running():
        yield made


@pytest.fixture(scope="module")
def client(fake: FakeApp) -> httpx.Client:
    assert fake.http is not None
    return fake.http


def test_put_file_over_the_cap_is_413_and_nothing_is_written(contract: Contract) -> None:
    with FakeApp(put_file_max_bytes=1000).running() as c:
        sid = c.post("/sessions").json()["session_id"]
        r = c.post(
            f"/sessions/{sid}/files",
            files={"file": ("big.bin", b"x" * 5000)},
            data={"path": "big.bin"},
        )
        assert r.status_code == 413
        contract.check(r, "Error")
        listing = c.get(f"/sessions/{sid}/files/list").json()["files"]
        assert listing == []
        ok = c.post(f"/sessions/{sid}/files", files={"file": ("small.bin", b"x" * 1000)})
        assert ok.status_code == 201


def test_names_that_are_not_utf8_are_listed_and_served_escaped(
    fake: FakeApp, client: httpx.Client, session_id: str
) -> None:
    with open(os.fsencode(fake.workspace(session_id)) + b"/bad\xff.txt", "wb") as f:
        f.write(b"x")
    listing = client.get(f"/sessions/{session_id}/files/list")
    assert listing.status_code == 200
    assert "bad\\xff.txt" in [f["path"] for f in listing.json()["files"]]
    r = client.get(f"/sessions/{session_id}/files", params={"path": "bad\\xff.txt"})
    assert (r.status_code, r.content) == (200, b"x")


def test_control_characters_in_a_name_do_not_break_the_download(
    fake: FakeApp, client: httpx.Client, session_id: str
) -> None:
    (fake.workspace(session_id) / "a\nb\r.txt").write_text("hi")
    r = client.get(f"/sessions/{session_id}/files", params={"path": "a\nb\r.txt"})
    assert (r.status_code, r.text) == (200, "hi")
    assert "\n" not in r.headers["content-disposition"]


def test_lone_surrogates_are_422_naming_the_field(client: httpx.Client, session_id: str) -> None:
    cases = [
        ('{"tool": "code_execution", "input": {"code": "print(\'\\ud800\')"}}', "input.code"),
        ('{"tool": "bash_code_execution", "input": {"command": "echo \\udcff"}}', "input.command"),
        (
            '{"tool": "text_editor_code_execution", "input": {"command": "view", "path": "\\ud800"}}',
            "input.path",
        ),
    ]
    for body, field in cases:
        r = client.post(
            f"/sessions/{session_id}/exec",
            content=body.encode(),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 422 and field in r.json()["detail"], r.text
    assert run(client, session_id, "code_execution", code="print('alive')")["stdout"] == "alive\n"


def test_deeply_nested_json_is_422(client: httpx.Client, session_id: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/sessions", f"/sessions/{session_id}/exec"):
        r = client.post(path, content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text


def test_options_and_405_name_every_method_of_a_resource(
    client: httpx.Client, session_id: str
) -> None:
    r = client.options(f"/sessions/{session_id}/files")
    assert r.status_code == 204
    assert {"GET", "POST"} <= {m.strip() for m in r.headers["allow"].split(",")}
    r = client.put(f"/sessions/{session_id}/files")
    assert r.status_code == 405
    assert {"GET", "POST"} <= {m.strip() for m in r.headers["allow"].split(",")}


def test_integers_written_as_floats_are_integers(client: httpx.Client) -> None:
    r = client.post("/sessions", json={"idle_timeout_seconds": 133262648822401.0})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    r = client.post(
        f"/sessions/{sid}/exec",
        json={"tool": "code_execution", "input": {"code": "1"}, "timeout_seconds": 5.0},
    )
    assert r.status_code == 200, r.text
    r = client.post("/sessions", json={"idle_timeout_seconds": 2.5})
    assert r.status_code == 422
    client.delete(f"/sessions/{sid}")
