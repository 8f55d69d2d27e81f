"""What a hostile client (or the code it runs) does at the HTTP edge: a clear 4xx, nothing lost."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.execapi.conftest import run
from tests.support import Server, data_dir
from tests.tiers import needs


def _loop_devices_of(path: str) -> list[str]:
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if path in line]


@pytest.fixture(scope="module")
@needs("root")
def unpooled() -> Iterator[Server]:
    """A server without a warm pool: every loop device under its data dir is a session's."""
    with data_dir() as d:
        srv = Server(d, pool_size=0).start()
        try:
            yield srv
        finally:
            srv.stop()


def test_destroy_during_a_stalled_download_gives_the_disk_back(unpooled: Server) -> None:
    server = unpooled
    with server.client() as client:
        _destroy_during_download(server, client)


def _destroy_during_download(server: Server, client: httpx.Client) -> None:
    sid = client.post("/sessions", json={}).json()["session_id"]
    run(client, sid, "code_execution", code="open('big.bin', 'wb').write(b'x' * 8_000_000)")
    image_dir = str(server.data.resolve() / "sandboxes")
    assert _loop_devices_of(image_dir)
    with client.stream("GET", f"/sessions/{sid}/files", params={"path": "big.bin"}) as r:
        assert r.status_code == 200
        next(r.iter_bytes(1024))  # the client reads a little, then stalls
        assert client.delete(f"/sessions/{sid}").status_code == 204
        deadline = time.monotonic() + 10
        while _loop_devices_of(image_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _loop_devices_of(image_dir) == [], "the destroyed session's disk is still held"
    assert client.get(f"/sessions/{sid}/files/list").status_code == 404


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


def test_names_that_are_not_utf8_are_shown_escaped_everywhere(
    client: httpx.Client, session_id: str
) -> None:
    result = run(
        client, session_id, "code_execution", code="open(b'bad\\xff.txt', 'wb').write(b'x')"
    )
    names = [f["filename"] for f in result["content"]]
    assert names == ["bad\\xff.txt"], result
    listing = client.get(f"/sessions/{session_id}/files/list")
    assert listing.status_code == 200
    assert "bad\\xff.txt" in [f["path"] for f in listing.json()["files"]]
    r = client.get(f"/sessions/{session_id}/files", params={"path": "bad\\xff.txt"})
    assert (r.status_code, r.content) == (200, b"x")


def test_control_characters_in_a_name_do_not_break_the_download(
    client: httpx.Client, session_id: str
) -> None:
    run(client, session_id, "code_execution", code="open('a\\nb\\r.txt', 'w').write('hi')")
    r = client.get(f"/sessions/{session_id}/files", params={"path": "a\nb\r.txt"})
    assert (r.status_code, r.text) == (200, "hi")
    assert "\n" not in r.headers["content-disposition"]


def test_put_file_on_a_workspace_out_of_inodes_is_413(
    client: httpx.Client, session_id: str
) -> None:
    run(
        client, session_id, "code_execution",
        code="import os\nos.mkdir('n')\ni = 0\ntry:\n    while True:\n"
        "        open(f'n/{i}', 'w').close(); i += 1\nexcept OSError as e:\n    print(e.errno)",
    )  # fmt: skip
    r = client.post(f"/sessions/{session_id}/files", files={"file": ("x.txt", b"data")})
    assert r.status_code == 413 and "full" in r.json()["detail"], r.text
    run(client, session_id, "bash_code_execution", command="rm -r n")
    r = client.post(f"/sessions/{session_id}/files", files={"file": ("x.txt", b"data")})
    assert r.status_code == 201, r.text


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
