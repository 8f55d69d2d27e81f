"""The E2B door's shapes and errors, over the fake backend (no sandbox runs: the fast tier)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from starlette.testclient import TestClient

from sandbank.app import create_app
from sandbank.protocol.calls import ExecResult, PythonCall, ToolCall
from sandbank.sandbox.backends.fake import FakeBackend
from sandbank.sandbox.local import LocalSandboxes
from tests.support import data_dir, settings

KEY_A, KEY_B = "door-key-a", "door-key-b"


def answer(call: ToolCall) -> ExecResult:
    """What the fake sandbox's Python answers: `1/0` fails, anything else is 2."""
    if isinstance(call, PythonCall) and call.code == "1/0":
        return ExecResult(stderr="", return_code=1, error=_error())
    return ExecResult(stdout="out\n", main={"data": {"text/plain": "2", "text/html": "<b>2</b>"}})


def _error() -> Any:
    from sandbank.protocol.calls import CellError

    return CellError("ZeroDivisionError", "division by zero", "Traceback...\nZeroDivisionError")


@pytest.fixture
def data() -> Iterator[Path]:
    with data_dir() as d:
        yield d


@pytest.fixture
def client(data: Path) -> Iterator[TestClient]:
    s = settings(data, exec_tokens=f"{KEY_A},{KEY_B}", interpreter_api="off", web_ui="off")
    sandboxes = LocalSandboxes(s, FakeBackend(s, answer))
    with TestClient(create_app(s, sandboxes=sandboxes), base_url="http://localhost") as c:
        yield c


def create(client: TestClient, key: str = KEY_A, **body: Any) -> dict[str, Any]:
    r = client.post(
        "/v2/sandboxes", headers={"X-API-Key": key}, json={"templateID": "base", **body}
    )
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def inside(sbx: dict[str, Any], port: int = 49983, token: bool = True) -> dict[str, str]:
    headers = {"E2b-Sandbox-Id": sbx["sandboxID"], "E2b-Sandbox-Port": str(port)}
    if token:
        headers["X-Access-Token"] = sbx["envdAccessToken"]
    return headers


def rpc(client: TestClient, sbx: dict[str, Any], method: str, body: Any) -> Any:
    return client.post(f"/{method}", headers=inside(sbx), json=body)


def envelopes(raw: bytes) -> list[tuple[int, Any]]:
    out, at = [], 0
    while at < len(raw):
        flags, size = struct.unpack(">BI", raw[at : at + 5])
        out.append((flags, json.loads(raw[at + 5 : at + 5 + size])))
        at += 5 + size
    return out


def stream(client: TestClient, sbx: dict[str, Any], method: str, body: Any) -> Any:
    payload = json.dumps(body).encode()
    return client.post(
        f"/{method}",
        headers={**inside(sbx), "Content-Type": "application/connect+json"},
        content=struct.pack(">BI", 0, len(payload)) + payload,
    )


# --- the control plane ------------------------------------------------------------------------
def test_a_key_is_needed_and_errors_have_e2b_s_shape(client: TestClient) -> None:
    r = client.post("/v2/sandboxes", json={"templateID": "base"})
    assert r.status_code == 401 and r.json()["code"] == 401 and "message" in r.json()
    r = client.post("/v2/sandboxes", headers={"X-API-Key": "nope"}, json={"templateID": "base"})
    assert r.status_code == 401
    r = client.post("/v2/sandboxes", headers={"X-API-Key": KEY_A}, json={"timeout": 5})
    assert r.status_code == 400 and r.json()["code"] == 400 and "templateID" in r.json()["message"]
    r = client.post("/v2/sandboxes", headers={"X-API-Key": KEY_A}, content=b"[1]")
    assert r.status_code == 400 and r.json()["code"] == 400


def test_create_answers_what_the_sdks_read(client: TestClient) -> None:
    sbx = create(client, templateID="code-interpreter-v1", metadata={"k": "v"})
    tenant = hashlib.sha256(KEY_A.encode()).hexdigest()[:24]
    assert sbx["sandboxID"].startswith(tenant + ".")
    assert sbx["templateID"] == "code-interpreter-v1" and sbx["envdVersion"] == "0.6.13"
    assert sbx["envdAccessToken"] and sbx["clientID"] and sbx["domain"] is None
    info = client.get(f"/sandboxes/{sbx['sandboxID']}", headers={"X-API-Key": KEY_A}).json()
    assert info["metadata"] == {"k": "v"} and info["state"] == "running"
    assert info["envdAccessToken"] == sbx["envdAccessToken"]


def test_another_key_s_sandbox_does_not_exist(client: TestClient) -> None:
    sbx = create(client)
    for method, path in (
        ("GET", ""), ("DELETE", ""), ("POST", "/timeout"), ("POST", "/pause"),
        ("GET", "/metrics"),
    ):  # fmt: skip
        r = client.request(
            method, f"/sandboxes/{sbx['sandboxID']}{path}", headers={"X-API-Key": KEY_B},
            json={"timeout": 5} if path == "/timeout" else None,
        )  # fmt: skip
        assert r.status_code == 404 and r.json()["code"] == 404, (method, path)
    r = client.post(
        f"/v2/sandboxes/{sbx['sandboxID']}/connect", headers={"X-API-Key": KEY_B}, json={}
    )
    assert r.status_code == 404
    assert client.get("/v2/sandboxes", headers={"X-API-Key": KEY_B}).json() == []
    # A public id naming another tenant with this session is no more than an unknown one.
    forged = (
        hashlib.sha256(KEY_B.encode()).hexdigest()[:24] + "." + sbx["sandboxID"].split(".", 1)[1]
    )
    assert client.get(f"/sandboxes/{forged}", headers={"X-API-Key": KEY_B}).status_code == 404


def test_list_pages_and_filters_by_metadata(client: TestClient) -> None:
    made = [create(client, metadata={"who": "a b", "n": str(i)})["sandboxID"] for i in range(3)]
    create(client, metadata={"who": "other"})
    seen: list[str] = []
    token = None
    for _ in range(5):
        query = {"metadata": urlencode({"who": quote("a b")}), "limit": "1"}
        if token:
            query["nextToken"] = token
        r = client.get("/v2/sandboxes", params=query, headers={"X-API-Key": KEY_A})
        assert r.status_code == 200
        seen += [s["sandboxID"] for s in r.json()]
        token = r.headers.get("x-next-token")
        if not token:
            break
    assert sorted(seen) == sorted(made)
    r = client.get("/v2/sandboxes", params={"state": "paused"}, headers={"X-API-Key": KEY_A})
    assert r.json() == []
    r = client.get("/v2/sandboxes", params={"state": "gone"}, headers={"X-API-Key": KEY_A})
    assert r.status_code == 400


def test_set_timeout_moves_the_end_and_kill_ends_it(client: TestClient) -> None:
    sbx = create(client, timeout=60)
    path = f"/sandboxes/{sbx['sandboxID']}"
    before = client.get(path, headers={"X-API-Key": KEY_A}).json()["endAt"]
    r = client.post(f"{path}/timeout", headers={"X-API-Key": KEY_A}, json={"timeout": 3000})
    assert r.status_code == 204
    assert client.get(path, headers={"X-API-Key": KEY_A}).json()["endAt"] > before
    r = client.post(f"{path}/timeout", headers={"X-API-Key": KEY_A}, json={"timeout": "soon"})
    assert r.status_code == 400
    assert client.post(f"{path}/pause", headers={"X-API-Key": KEY_A}).status_code == 501
    assert client.delete(path, headers={"X-API-Key": KEY_A}).status_code == 204
    assert client.delete(path, headers={"X-API-Key": KEY_A}).json()["code"] == 404
    r = client.get("/health", headers=inside(sbx))
    assert r.status_code == 502 and "was not found" in r.json()["message"]


# --- envd --------------------------------------------------------------------------------------
def test_envd_wants_the_sandbox_s_token(client: TestClient) -> None:
    sbx = create(client)
    assert client.get("/health", headers=inside(sbx, token=False)).status_code == 204
    r = client.post("/filesystem.Filesystem/Stat", headers=inside(sbx, token=False), json={})
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    other = create(client)
    wrong = {**inside(sbx), "X-Access-Token": other["envdAccessToken"]}
    assert client.post("/filesystem.Filesystem/Stat", headers=wrong, json={}).status_code == 401
    assert client.get("/files?path=x", headers=inside(sbx, token=False)).status_code == 401
    r = client.get("/health", headers={**inside(sbx), "E2b-Sandbox-Port": "8080"})
    assert r.status_code == 502 and "port is not open" in r.json()["message"]


def test_filesystem_rpcs_in_connect_s_json(client: TestClient) -> None:
    sbx = create(client)
    r = rpc(client, sbx, "filesystem.Filesystem/MakeDir", {"path": "/home/user/d/e"})
    assert r.status_code == 200 and r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    r = rpc(client, sbx, "filesystem.Filesystem/MakeDir", {"path": "d/e"})
    assert r.status_code == 409 and r.json()["code"] == "already_exists"
    r = rpc(client, sbx, "filesystem.Filesystem/Stat", {"path": "nope"})
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = rpc(client, sbx, "filesystem.Filesystem/Stat", {"path": "/etc/passwd"})
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    r = rpc(client, sbx, "filesystem.Filesystem/ListDir", {"path": "/home/user", "depth": 2})
    entries = r.json()["entries"]
    assert [e["path"] for e in entries] == ["/home/user/d", "/home/user/d/e"]
    assert entries[0]["size"].isdigit() and entries[0]["modifiedTime"].endswith("Z")
    r = rpc(client, sbx, "filesystem.Filesystem/Move", {"source": "d", "destination": "f/g"})
    assert r.json()["entry"]["path"] == "/home/user/f/g"
    assert rpc(client, sbx, "filesystem.Filesystem/Remove", {"path": "f"}).json() == {}
    assert rpc(client, sbx, "filesystem.Filesystem/Remove", {"path": "f"}).status_code == 200
    r = client.post(
        "/filesystem.Filesystem/Stat",
        headers={**inside(sbx), "Content-Type": "application/proto"},
        content=b"\x0a\x01x",
    )
    assert r.status_code == 415
    r = client.post(
        "/filesystem.Filesystem/Stat",
        headers={**inside(sbx), "Content-Type": "application/json"},
        content=b"{not json",
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"


def test_a_process_streams_as_connect_envelopes(client: TestClient) -> None:
    sbx = create(client)
    body = {"process": {"cmd": "/bin/bash", "args": ["-c", "hi"]}, "stdin": False}
    r = stream(client, sbx, "process.Process/Start", body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/connect+json"
    frames = envelopes(r.content)
    assert frames[0] == (0, {"event": {"start": {"pid": frames[0][1]["event"]["start"]["pid"]}}})
    assert base64.b64decode(frames[1][1]["event"]["data"]["stdout"]) == b"-c hi\n"
    assert frames[2][1]["event"]["end"]["exitCode"] == 0 and frames[2][1]["event"]["end"]["exited"]
    assert frames[-1] == (2, {})
    # An error of a stream travels in its end, the HTTP status stays 200.
    r = stream(client, sbx, "process.Process/Connect", {"process": {"pid": 424242}})
    assert r.status_code == 200
    assert envelopes(r.content) == [
        (2, {"error": {"code": "not_found", "message": "process with pid 424242 not found"}})
    ]
    r = stream(client, sbx, "process.Process/Start", {"process": {"cmd": "x"}, "pty": {}})
    assert envelopes(r.content)[-1][1]["error"]["code"] == "unimplemented"
    r = rpc(
        client,
        sbx,
        "process.Process/SendSignal",
        {"process": {"pid": 424242}, "signal": "SIGNAL_SIGKILL"},
    )
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert rpc(client, sbx, "process.Process/List", {}).json() == {"processes": []}


def test_files_up_and_down(client: TestClient) -> None:
    sbx = create(client)
    r = client.post(
        "/files", params={"path": "/home/user/up/a.txt"}, headers=inside(sbx),
        files={"file": ("a.txt", b"hello")},
    )  # fmt: skip
    assert r.status_code == 200 and r.json() == [
        {"name": "a.txt", "type": "file", "path": "/home/user/up/a.txt"}
    ]
    r = client.post(
        "/files", headers=inside(sbx),
        files=[("file", ("up/b.txt", b"b")), ("file", ("/home/user/up/c.txt", b"c"))],
    )  # fmt: skip
    assert [f["path"] for f in r.json()] == ["/home/user/up/b.txt", "/home/user/up/c.txt"]
    r = client.get("/files", params={"path": "up/a.txt"}, headers=inside(sbx))
    assert r.status_code == 200 and r.content == b"hello" and r.headers["content-length"] == "5"
    octets = {**inside(sbx), "Content-Type": "application/octet-stream"}
    r = client.post(
        "/files",
        params={"path": "z.txt"},
        headers={**octets, "Content-Encoding": "gzip"},
        content=gzip.compress(b"zipped"),
    )
    assert r.status_code == 200 and r.json()[0]["path"] == "/home/user/z.txt"
    assert client.get("/files", params={"path": "z.txt"}, headers=inside(sbx)).content == b"zipped"
    r = client.post(
        "/files",
        params={"path": "z.txt"},
        headers={**octets, "Content-Encoding": "gzip"},
        content=b"not gzip",
    )
    assert r.status_code == 400
    r = client.get("/files", params={"path": "up/none"}, headers=inside(sbx))
    assert r.status_code == 404 and r.json()["code"] == 404
    r = client.get("/files", params={"path": "up"}, headers=inside(sbx))
    assert r.status_code == 400
    # A presigned download (the SDKs' download_url): the signature stands for the token.
    raw = f"up/a.txt:read::{sbx['envdAccessToken']}"
    sig = "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")
    no_token = inside(sbx, token=False)
    r = client.get("/files", params={"path": "up/a.txt", "signature": sig}, headers=no_token)
    assert r.status_code == 200 and r.content == b"hello"
    r = client.get("/files", params={"path": "up/b.txt", "signature": sig}, headers=no_token)
    assert r.status_code == 401


# --- the code interpreter ------------------------------------------------------------------------
def execute(client: TestClient, sbx: dict[str, Any], **body: Any) -> Any:
    return client.post("/execute", headers=inside(sbx, 49999), json={"code": "1+1", **body})


def test_execute_streams_e2b_s_lines(client: TestClient) -> None:
    sbx = create(client)
    r = execute(client, sbx)
    assert r.status_code == 200
    lines = [json.loads(line) for line in r.text.split("\n") if line]
    assert "\n\n" not in r.text and r.text.endswith("\n")
    kinds = [line["type"] for line in lines]
    assert kinds == ["stdout", "result", "number_of_executions", "end_of_execution"]
    assert lines[0]["text"] == "out\n" and lines[0]["timestamp"]
    assert lines[1] == {"type": "result", "text": "2", "html": "<b>2</b>", "is_main_result": True}
    assert lines[2]["execution_count"] == 1
    failed = [
        json.loads(line) for line in execute(client, sbx, code="1/0").text.split("\n") if line
    ]
    assert failed[0] == {
        "type": "error", "name": "ZeroDivisionError", "value": "division by zero",
        "traceback": "Traceback...\nZeroDivisionError",
    }  # fmt: skip


def test_execute_refuses_what_e2b_refuses(client: TestClient) -> None:
    sbx = create(client)
    r = client.post("/execute", headers=inside(sbx, 49999, token=False), json={"code": "1"})
    assert r.status_code == 401
    r = execute(client, sbx, language="ruby")
    assert r.status_code == 500 and "kernel is not available" in r.text
    r = execute(client, sbx, language="python", context_id="x")
    assert r.status_code == 400 and "Only one of" in r.text
    r = execute(client, sbx, context_id="nope")
    assert r.status_code == 404 and r.text == "Context nope not found"
    r = client.post("/execute", headers=inside(sbx, 49999), json={"nocode": 1})
    assert r.status_code == 422


def test_contexts(client: TestClient) -> None:
    sbx = create(client)
    headers = inside(sbx, 49999, token=False)  # the SDKs send no token to /contexts
    made = client.post("/contexts", headers=headers, json={"cwd": "/home/user/w"}).json()
    assert made["language"] == "python" and made["cwd"] == "/home/user/w"
    listed = client.get("/contexts", headers=headers).json()
    assert made in listed and any(c["id"] == "default" for c in listed)
    r = execute(client, sbx, context_id=made["id"])
    assert r.status_code == 200
    assert client.post(f"/contexts/{made['id']}/restart", headers=headers).json() is None
    assert client.delete(f"/contexts/{made['id']}", headers=headers).status_code == 200
    assert client.delete(f"/contexts/{made['id']}", headers=headers).status_code == 404
    r = client.post("/contexts", headers=headers, json={"language": "r"})
    assert r.status_code == 500 and "'r' kernel" in r.text


def test_an_unknown_or_malformed_sandbox_is_gone(client: TestClient) -> None:
    for sid in ("nope", "0" * 24 + ".nope", "../etc"):
        for port in (49983, 49999):
            r = client.get(
                "/health", headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(port)}
            )
            assert r.status_code == 502 and r.json()["message"] == "The sandbox was not found"
