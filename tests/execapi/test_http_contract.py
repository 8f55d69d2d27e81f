"""Contract v1's HTTP behaviour: shapes, status codes and error bodies, each response validated
against the contract's schemas.

Here over the whole app in-process on the fake backend (tests/fakeapp.py); tests/fleet runs the
same functions through a real front and real nodes. What needs real execution (state, timeouts,
produced files, symlinks planted by code, concurrency) is in test_conformance.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.execapi.conftest import Contract
from tests.fakeapp import FakeApp
from tests.support import REPO


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    """The app over fakes, with the real server suite's settings (tests/execapi/conftest.py)."""
    fake = FakeApp(max_sessions=8, exec_timeout_default=30, exec_timeout_max=30)
    with fake.running() as http:
        yield http


def put(client: httpx.Client, sid: str, path: str, content: bytes) -> None:
    r = client.post(f"/sessions/{sid}/files", files={"file": ("f", content)}, data={"path": path})
    assert r.status_code == 201, r.text


def test_create_session_returns_a_handle_with_what_is_in_force(
    client: httpx.Client, contract: Contract
) -> None:
    before = time.time()
    r = client.post("/sessions", json={"idle_timeout_seconds": 30, "image": "python:3.11-whatever"})
    assert r.status_code == 201
    handle = contract.check(r, "SessionHandle")
    assert handle["idle_timeout_seconds"] == 30
    assert handle["max_lifetime_seconds"] >= 1
    assert before - 1 <= handle["created_at"] <= time.time() + 1
    assert len(handle["session_id"]) >= 20  # unguessable
    client.delete(f"/sessions/{handle['session_id']}")


@pytest.mark.parametrize("body", [None, b"", b"{}"])
def test_create_session_body_may_be_absent_or_empty(
    client: httpx.Client, body: bytes | None
) -> None:
    r = client.post("/sessions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    client.delete(f"/sessions/{r.json()['session_id']}")


def test_lifetime_hints_above_the_ceilings_are_clamped(client: httpx.Client) -> None:
    r = client.post(
        "/sessions", json={"idle_timeout_seconds": 10**9, "max_lifetime_seconds": 10**9}
    )
    assert r.status_code == 201
    h = r.json()
    assert h["idle_timeout_seconds"] == 3600 and h["max_lifetime_seconds"] == 86400
    client.delete(f"/sessions/{h['session_id']}")


@pytest.mark.parametrize(
    "body",
    [{"idle_timeout_seconds": "5"}, {"max_lifetime_seconds": 0}, {"image": 5}, [1, 2]],
)
def test_create_session_refuses_wrong_types_with_422_naming_the_field(
    client: httpx.Client, contract: Contract, body: Any
) -> None:
    r = client.post("/sessions", json=body)
    assert r.status_code == 422
    detail = contract.check(r, "Error")["detail"]
    if isinstance(body, dict):
        assert next(iter(body)) in detail


def test_execute_envelope_for_every_tool_kind(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    cases = [
        ("code_execution", {"code": "print(2 + 2)"}, "code_execution_tool_result"),
        ("bash_code_execution", {"command": "echo hi"}, "bash_code_execution_tool_result"),
        (
            "text_editor_code_execution",
            {"command": "create", "path": "a.txt", "file_text": "x\n"},
            "text_editor_code_execution_tool_result",
        ),
    ]
    for tool, inp, block_type in cases:
        r = client.post(
            f"/sessions/{session_id}/exec", json={"tool": tool, "input": inp, "tool_use_id": "t-1"}
        )
        assert r.status_code == 200
        body = contract.check(r, "ExecResponse")
        assert body["tool_use_id"] == "t-1" and body["result_block"]["tool_use_id"] == "t-1"
        block = body["result_block"]
        assert block["type"] == block_type
        assert block["content"]["type"] == "code_execution_result"
        assert block["content"]["return_code"] == 0
        assert isinstance(body["execution_time_ms"], int)


def test_tool_use_id_is_generated_when_absent(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    r = client.post(
        f"/sessions/{session_id}/exec",
        json={"tool": "code_execution", "input": {"code": "1"}, "timeout_seconds": 60},
    )
    body = contract.check(r, "ExecResponse")
    assert body["tool_use_id"] and body["tool_use_id"] == body["result_block"]["tool_use_id"]


def test_a_failed_program_is_a_successful_call(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    r = client.post(
        f"/sessions/{session_id}/exec",
        json={"tool": "code_execution", "input": {"code": "raise ValueError('boom')"}},
    )
    assert r.status_code == 200
    content = contract.check(r, "ExecResponse")["result_block"]["content"]
    assert content["return_code"] == 1 and "ValueError: boom" in content["stderr"]
    assert content["type"] != "code_execution_tool_result_error"


def test_unknown_fields_are_ignored_everywhere(client: httpx.Client, session_id: str) -> None:
    r = client.post(
        f"/sessions/{session_id}/exec",
        json={
            "tool": "code_execution",
            "input": {"code": "print(1)", "future": True},
            "later": {"x": 1},
        },
    )
    assert r.status_code == 200 and r.json()["result_block"]["content"]["stdout"] == "1\n"
    r = client.post("/sessions", json={"future_hint": 1})
    assert r.status_code == 201
    client.delete(f"/sessions/{r.json()['session_id']}")


def test_unknown_tool_kind_is_400(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    r = client.post(f"/sessions/{session_id}/exec", json={"tool": "web_search", "input": {}})
    assert r.status_code == 400 and "web_search" in contract.check(r, "Error")["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tool": "code_execution"}, "input"),
        ({"tool": "code_execution", "input": {}}, "input.code"),
        ({"tool": "code_execution", "input": {"code": 5}}, "input.code"),
        ({"tool": "code_execution", "input": {"code": ""}}, "input.code"),
        ({"tool": "bash_code_execution", "input": {}}, "input.command"),
        (
            {"tool": "text_editor_code_execution", "input": {"command": "create", "path": "a"}},
            "file_text",
        ),
        (
            {
                "tool": "text_editor_code_execution",
                "input": {"command": "str_replace", "path": "a", "new_str": ""},
            },
            "old_str",
        ),
        (
            {
                "tool": "text_editor_code_execution",
                "input": {"command": "insert", "path": "a", "new_str": "x"},
            },
            "insert_line",
        ),
        ({"tool": "text_editor_code_execution", "input": {"command": "view"}}, "input.path"),
        (
            {"tool": "text_editor_code_execution", "input": {"command": "delete", "path": "a"}},
            "input.command",
        ),
        (
            {"tool": "code_execution", "input": {"code": "1"}, "timeout_seconds": "10"},
            "timeout_seconds",
        ),
        ({"input": {"code": "1"}}, "tool"),
    ],
)
def test_malformed_requests_are_422_naming_the_field(
    client: httpx.Client, session_id: str, contract: Contract, body: dict[str, Any], field: str
) -> None:
    r = client.post(f"/sessions/{session_id}/exec", json=body)
    assert r.status_code == 422, r.text
    assert field in contract.check(r, "Error")["detail"]


def test_malformed_json_and_non_json_bodies(client: httpx.Client, session_id: str) -> None:
    r = client.post(
        f"/sessions/{session_id}/exec",
        content=b"{nope",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and "JSON" in r.json()["detail"]
    r = client.post(
        f"/sessions/{session_id}/exec",
        content=b'{"tool":"code_execution","input":{"code":"1"}}',
        headers={"content-type": "text/plain"},
    )
    assert r.status_code == 415


def test_unknown_session_is_404_on_every_session_operation(
    client: httpx.Client, contract: Contract
) -> None:
    sid = "no-such-session"
    for r in (
        client.post(
            f"/sessions/{sid}/exec", json={"tool": "code_execution", "input": {"code": "1"}}
        ),
        client.get(f"/sessions/{sid}/files/list"),
        client.get(f"/sessions/{sid}/files", params={"path": "a"}),
        client.post(f"/sessions/{sid}/files", files={"file": ("a.txt", b"x")}),
    ):
        assert r.status_code == 404, r.request.url
        contract.check(r, "Error")


def test_destroy_is_204_also_for_unknown_and_repeated(client: httpx.Client) -> None:
    sid = client.post("/sessions").json()["session_id"]
    assert client.delete(f"/sessions/{sid}").status_code == 204
    assert client.delete(f"/sessions/{sid}").status_code == 204
    assert client.delete("/sessions/never-existed").status_code == 204
    r = client.post(
        f"/sessions/{sid}/exec", json={"tool": "code_execution", "input": {"code": "1"}}
    )
    assert r.status_code == 404


def test_html_in_the_workspace_is_never_served_as_a_page(
    client: httpx.Client, session_id: str
) -> None:
    put(client, session_id, "x.html", b"<script>alert(1)</script>\n")
    put(client, session_id, "y.svg", b"<svg onload=alert(1)>\n")
    for name in ("x.html", "y.svg"):
        r = client.get(f"/sessions/{session_id}/files", params={"path": name})
        assert r.headers["content-disposition"].startswith("attachment")
        assert r.headers["content-security-policy"].startswith("sandbox")
        assert r.headers["x-content-type-options"] == "nosniff"


def test_list_files_one_level_with_directories_marked(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    put(client, session_id, "top.txt", b"12345\n")
    put(client, session_id, "d/in.txt", b"x\n")
    put(client, session_id, "d/e/deep.txt", b"y\n")
    body = contract.check(client.get(f"/sessions/{session_id}/files/list"), "FileList")
    by_path = {f["path"]: f for f in body["files"]}
    assert by_path["top.txt"]["size_bytes"] == 6 and by_path["top.txt"]["mime_type"] == "text/plain"
    assert by_path["d"]["is_dir"] is True and "d/in.txt" not in by_path
    assert body["truncated"] is False
    inner = contract.check(
        client.get(f"/sessions/{session_id}/files/list", params={"path": "d"}), "FileList"
    )
    assert sorted(f["path"] for f in inner["files"]) == ["d/e", "d/in.txt"]
    single = client.get(
        f"/sessions/{session_id}/files/list", params={"path": "/workspace/top.txt"}
    ).json()
    assert [f["path"] for f in single["files"]] == ["top.txt"]
    assert (
        client.get(f"/sessions/{session_id}/files/list", params={"path": "nope"}).status_code == 404
    )


def test_list_files_changes_are_visible_by_size_and_mtime(
    client: httpx.Client, session_id: str
) -> None:
    put(client, session_id, "w.txt", b"a\n")
    first = {f["path"]: f for f in client.get(f"/sessions/{session_id}/files/list").json()["files"]}
    put(client, session_id, "w.txt", b"abc\n")
    second = {
        f["path"]: f for f in client.get(f"/sessions/{session_id}/files/list").json()["files"]
    }
    assert (first["w.txt"]["size_bytes"], first["w.txt"]["modified_at"]) != (
        second["w.txt"]["size_bytes"], second["w.txt"]["modified_at"],
    )  # fmt: skip


@pytest.mark.parametrize(
    "path", ["..", "../etc/passwd", "/etc/passwd", "a/../../x", "/workspace/../etc"]
)
def test_path_escapes_are_403(
    client: httpx.Client, session_id: str, contract: Contract, path: str
) -> None:
    for r in (
        client.get(f"/sessions/{session_id}/files/list", params={"path": path}),
        client.get(f"/sessions/{session_id}/files", params={"path": path}),
        client.post(
            f"/sessions/{session_id}/files", files={"file": ("x", b"x")}, data={"path": path}
        ),
    ):
        assert r.status_code == 403, (r.request.url, r.text)
        contract.check(r, "Error")


def test_openapi_contains_the_whole_seed_contract_and_lists_every_addition(
    client: httpx.Client, spec: dict[str, Any]
) -> None:
    served = client.get("/openapi.json").json()
    additions = set(served["info"]["x-sandbank-additions"])
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            for status in op["responses"]:
                assert status in served["paths"][path][method]["responses"], (path, method, status)
    for name, schema in spec["components"]["schemas"].items():
        for key, value in schema.items():
            if key != "properties":
                assert served["components"]["schemas"][name][key] == value, (name, key)
        for prop in schema.get("properties", {}):
            assert prop in served["components"]["schemas"][name]["properties"]

    # Everything served beyond the seed is listed as an addition.
    def walk(seed: Any, doc: Any, where: str) -> None:
        if isinstance(doc, dict) and isinstance(seed, dict):
            for key, value in doc.items():
                here = f"{where}.{key}" if where else key
                if key not in seed:
                    if here != "info.x-sandbank-additions":
                        assert here in additions, here
                else:
                    walk(seed[key], value, here)

    walk(spec, served, "")
    readme = (REPO / "README.md").read_text()
    for item in additions:
        assert f"`{item}`" in readme, f"README's additions table misses {item}"


def test_health(client: httpx.Client) -> None:
    r = client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_host_header_outside_the_allow_list_is_refused(client: httpx.Client) -> None:
    r = client.get("/health", headers={"Host": "evil.example:8080"})
    assert r.status_code == 421 and "SANDBANK_ALLOWED_HOSTS" in r.json()["detail"]
    assert client.get("/health", headers={"Host": "localhost"}).status_code == 200
