"""Contract v1's HTTP behaviour: shapes, status codes and error bodies, each response validated
against the contract's schemas.

Here over the whole app in-process on the fake backend (tests/fakeapp.py); tests/fleet runs the
same functions through a front and nodes over fakes. What needs real execution (state, timeouts,
produced files, concurrency) is in test_conformance.py.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandbank.protocol.calls import RC_TIMEOUT
from tests.execapi.conftest import Contract, run
from tests.fakeapp import PNG, FakeApp
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


def test_timeout_is_answered_in_time_and_clamped(client: httpx.Client, session_id: str) -> None:
    """The call's budget is its deadline (tests/sandbox has a real sandbox held to one)."""
    t0 = time.monotonic()
    content = run_with(
        client,
        session_id,
        {
            "tool": "code_execution",
            "input": {"code": "import time; time.sleep(60)"},
            "timeout_seconds": 1,
        },
    )
    assert time.monotonic() - t0 < 1 + 5
    assert content["return_code"] == RC_TIMEOUT
    # A huge budget is clamped, not refused.
    content = run_with(
        client,
        session_id,
        {"tool": "code_execution", "input": {"code": "print('ok')"}, "timeout_seconds": 10**9},
    )
    assert content["stdout"] == "ok\n"


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


def test_put_file_answers_its_path_and_size_and_names_a_bare_upload_safely(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    r = client.post(
        f"/sessions/{session_id}/files",
        files={"file": ("data.csv", b"a,b\n1,2\n")},
        data={"path": "in/deep/data.csv"},
    )
    assert r.status_code == 201
    assert contract.check(r, "FileUploadResult") == {"path": "in/deep/data.csv", "size_bytes": 8}
    got = client.get(f"/sessions/{session_id}/files", params={"path": "in/deep/data.csv"})
    assert got.content == b"a,b\n1,2\n"
    # Without a path, the name comes from the upload, sanitized.
    r = client.post(
        f"/sessions/{session_id}/files", files={"file": ("../../evil name?.txt", io.BytesIO(b"z"))}
    )
    assert r.status_code == 201 and r.json()["path"] == "evil name_.txt"


def test_a_raster_image_is_served_inline_and_other_files_as_attachments(
    client: httpx.Client, session_id: str
) -> None:
    put(client, session_id, "out/figure.png", PNG)
    put(client, session_id, "out/r.csv", b"a,b\n1,2\n")
    png = client.get(f"/sessions/{session_id}/files", params={"path": "out/figure.png"})
    assert png.content == PNG and png.headers["content-type"] == "image/png"
    assert png.headers["content-disposition"].startswith("inline")
    csv = client.get(f"/sessions/{session_id}/files", params={"path": "out/r.csv"})
    assert csv.content == b"a,b\n1,2\n"
    assert csv.headers["content-disposition"].startswith("attachment")
    for r in (png, csv):
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["content-security-policy"].startswith("sandbox")


# --- what a program leaves in the workspace (the fake plants it as bash would: fakeapp.py) ---
def test_symlinks_planted_by_code_never_lead_out(client: httpx.Client, session_id: str) -> None:
    run(
        client,
        session_id,
        "bash_code_execution",
        command="ln -s / root; ln -s /etc/shadow sh; mkdir -p d; ln -s /etc d/etc; ln -s .. up; ln -s /proc/1/root pr",
    )
    for path in ("root/etc/passwd", "sh", "d/etc/passwd", "up/x", "pr/etc/shadow", "root"):
        r = client.get(f"/sessions/{session_id}/files", params={"path": path})
        assert r.status_code in (403, 404), (path, r.status_code)
        assert b"root:" not in r.content
    assert (
        client.get(f"/sessions/{session_id}/files/list", params={"path": "root"}).status_code == 403
    )
    listing = client.get(f"/sessions/{session_id}/files/list").json()["files"]
    assert {"root", "sh", "up", "pr"}.isdisjoint(f["path"] for f in listing)
    # Writing through a planted link stays inside too.
    r = client.post(
        f"/sessions/{session_id}/files", files={"file": ("x", b"evil")}, data={"path": "d/etc/evil"}
    )
    assert r.status_code == 403


def test_fifo_and_directory_are_not_served_as_files(client: httpx.Client, session_id: str) -> None:
    run(client, session_id, "bash_code_execution", command="mkfifo pipe; mkdir -p dir")
    assert client.get(f"/sessions/{session_id}/files", params={"path": "pipe"}).status_code == 404
    assert client.get(f"/sessions/{session_id}/files", params={"path": "dir"}).status_code == 400


def test_a_long_listing_is_cut_at_the_cap_and_says_so(
    client: httpx.Client, session_id: str
) -> None:
    run(
        client,
        session_id,
        "bash_code_execution",
        command="mkdir many && cd many && touch f{1..1005}",
    )
    body = client.get(f"/sessions/{session_id}/files/list", params={"path": "many"}).json()
    assert body["truncated"] is True and len(body["files"]) == 1000


def test_destroy_during_a_call_ends_it_with_a_result(client: httpx.Client) -> None:
    """The call is answered with a result, not an error (tests/sandbox has a real sandbox's
    running call ended by its destroy)."""
    sid = client.post("/sessions").json()["session_id"]
    out: dict[str, Any] = {}

    def call() -> None:
        out["r"] = client.post(
            f"/sessions/{sid}/exec",
            json={"tool": "code_execution", "input": {"code": "import time; time.sleep(30)"}},
        )

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.5)
    assert client.delete(f"/sessions/{sid}").status_code == 204
    t.join(10)
    r = out["r"]
    assert r.status_code == 200 and "destroyed" in r.json()["result_block"]["content"]["stderr"]


def run_with(client: httpx.Client, sid: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(f"/sessions/{sid}/exec", json=body)
    assert r.status_code == 200, r.text
    content: dict[str, Any] = r.json()["result_block"]["content"]
    return content


def test_an_isolation_hint_is_kept_with_the_session_and_one_not_offered_is_a_422(
    client: httpx.Client, contract: Contract
) -> None:
    r = client.post("/sessions", json={"isolation": "fork"})  # the fake app's server runs fork
    assert r.status_code == 201, r.text
    handle = contract.check(r, "SessionHandle")
    assert handle["isolation"] == "fork"
    client.delete(f"/sessions/{handle['session_id']}")
    for asked in ("gvisor", "microvm"):
        r = client.post("/sessions", json={"isolation": asked})
        assert r.status_code == 422, r.text
        detail = contract.check(r, "Error")["detail"]
        assert "isolation" in detail and ("'fork'" in detail or "gvisor" in detail), detail


def test_a_watch_is_refused_at_once_in_the_error_shape(
    client: httpx.Client, contract: Contract, session_id: str
) -> None:
    """The fuzz test leaves this stream out (an accepted watch lasts as long as its client):
    its refusals are answered here, at once, before any stream begins."""
    gone = client.get("/sessions/no-such-session/watch", params={"path": "."})
    assert gone.status_code == 404
    contract.check(gone, "Error")
    unnamed = client.get(f"/sessions/{session_id}/watch")
    assert unnamed.status_code == 400, unnamed.text
    assert "path" in contract.check(unnamed, "Error")["detail"]


def test_a_session_s_handle_answers_through_every_door(
    client: httpx.Client, session_id: str
) -> None:
    """GetSession (an addition): on a server, and through a fleet front (which serves the
    additions over the fleet's port), by the id the door gave."""
    got = client.get(f"/sessions/{session_id}")
    assert got.status_code == 200, got.text
    assert got.json()["session_id"] == session_id
    assert client.get(f"/sessions/{session_id}x").status_code == 404
