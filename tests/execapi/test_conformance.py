"""Conformance to contract v1 where the subject is real execution: state across calls, timeouts,
produced files, symlinks planted by code, concurrency, destroy during a call, the sandbox's
network. Every response validated against the contract's schemas. The HTTP behaviour alone
(shapes, status codes, error bodies) is tested over fakes in test_http_contract.py.
"""

from __future__ import annotations

import io
import itertools
import json
import threading
import time
from typing import Any

import httpx

from sandbank.protocol.calls import RC_TIMEOUT
from tests.execapi.conftest import Contract, run
from tests.support import Server


def test_state_persists_across_calls_of_all_three_kinds(
    client: httpx.Client, session_id: str
) -> None:
    assert run(client, session_id, "code_execution", code="x = 20")["return_code"] == 0
    assert run(client, session_id, "code_execution", code="x * 2 + 2")["stdout"] == "42\n"
    run(client, session_id, "bash_code_execution", command="cd /tmp && export V=7")
    assert (
        run(client, session_id, "bash_code_execution", command="echo $PWD $V")["stdout"]
        == "/tmp 7\n"
    )
    run(
        client,
        session_id,
        "text_editor_code_execution",
        command="create",
        path="f.txt",
        file_text="a\nb\n",
    )
    run(
        client,
        session_id,
        "text_editor_code_execution",
        command="str_replace",
        path="f.txt",
        old_str="b",
        new_str="B",
    )
    assert (
        run(client, session_id, "code_execution", code="print(open('f.txt').read())")["stdout"]
        == "a\nB\n\n"
    )
    viewed = run(
        client,
        session_id,
        "text_editor_code_execution",
        command="view",
        path="/workspace/f.txt",
        view_range=[2, -1],
    )
    assert viewed["stdout"] == "     2\tB\n"


def test_timeout_is_answered_in_time_and_clamped(client: httpx.Client, session_id: str) -> None:
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
    assert content["return_code"] == RC_TIMEOUT and "timed out" in content["stderr"]
    # A huge budget is clamped, not refused.
    content = run_with(
        client,
        session_id,
        {"tool": "code_execution", "input": {"code": "print('ok')"}, "timeout_seconds": 10**9},
    )
    assert content["stdout"] == "ok\n"


def run_with(client: httpx.Client, sid: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(f"/sessions/{sid}/exec", json=body)
    assert r.status_code == 200, r.text
    content: dict[str, Any] = r.json()["result_block"]["content"]
    return content


def test_produced_files_are_reported_and_served_by_getfile(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    content = run(
        client, session_id, "code_execution",
        code="import matplotlib.pyplot as plt, os\nos.makedirs('out', exist_ok=True)\nopen('out/r.csv','w').write('a,b\\n1,2\\n')\nplt.plot([1, 2])",
    )  # fmt: skip
    names = [f["filename"] for f in content["content"]]
    assert names == ["figure_1.png", "out/r.csv"]
    for f in content["content"]:
        assert f["type"] == "code_execution_output" and f["file_id"]
        r = client.get(f"/sessions/{session_id}/files", params={"path": f["filename"]})
        assert r.status_code == 200
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["content-security-policy"].startswith("sandbox")
    png = client.get(f"/sessions/{session_id}/files", params={"path": "figure_1.png"})
    assert png.content.startswith(b"\x89PNG") and png.headers["content-type"] == "image/png"
    assert png.headers["content-disposition"].startswith("inline")
    csv = client.get(f"/sessions/{session_id}/files", params={"path": "out/r.csv"})
    assert csv.content == b"a,b\n1,2\n" and csv.headers["content-disposition"].startswith(
        "attachment"
    )
    editor = run(
        client,
        session_id,
        "text_editor_code_execution",
        command="create",
        path="e.txt",
        file_text="x",
    )
    assert editor["content"] == []  # text-editor calls report no files


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


def test_put_file_is_visible_to_the_interpreter_and_owned_by_the_session(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    r = client.post(
        f"/sessions/{session_id}/files",
        files={"file": ("data.csv", b"a,b\n1,2\n")},
        data={"path": "in/deep/data.csv"},
    )
    assert r.status_code == 201
    assert contract.check(r, "FileUploadResult") == {"path": "in/deep/data.csv", "size_bytes": 8}
    out = run(
        client,
        session_id,
        "code_execution",
        code="import os, pandas as pd\nst = os.stat('in/deep/data.csv')\nprint(st.st_uid == os.getuid(), os.stat('in/deep').st_uid == os.getuid(), int(pd.read_csv('in/deep/data.csv')['b'].sum()))",
    )
    assert out["stdout"] == "True True 2\n"
    # Without a path, the name comes from the upload, sanitized.
    r = client.post(
        f"/sessions/{session_id}/files", files={"file": ("../../evil name?.txt", io.BytesIO(b"z"))}
    )
    assert r.status_code == 201 and r.json()["path"] == "evil name_.txt"


def test_concurrent_calls_on_one_session_run_one_at_a_time(server: Server, session_id: str) -> None:
    """Calls sent together never overlap, and each answer belongs to its own call."""
    with server.client() as c:
        run(c, session_id, "code_execution", code="import time\nspans = []")
    answered: list[tuple[int, str]] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        with server.client() as c:
            out = run(
                c,
                session_id,
                "code_execution",
                code=f"t0 = time.time(); time.sleep(0.2); spans.append((t0, time.time())); print({i})",
            )
        with lock:
            answered.append((i, out["stdout"]))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answered) == [(i, f"{i}\n") for i in range(3)]
    with server.client() as c:
        spans = json.loads(
            run(c, session_id, "code_execution", code="import json; print(json.dumps(spans))")[
                "stdout"
            ]
        )
    assert len(spans) == 3
    for (_, end), (start, _) in itertools.pairwise(sorted(spans)):
        assert end <= start  # one at a time


def test_destroy_during_a_call_ends_it_with_a_result(server: Server) -> None:
    with server.client() as c:
        sid = c.post("/sessions").json()["session_id"]
    out: dict[str, Any] = {}

    def call() -> None:
        with server.client() as c:
            out["r"] = c.post(
                f"/sessions/{sid}/exec",
                json={"tool": "code_execution", "input": {"code": "import time; time.sleep(30)"}},
            )

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.5)
    with server.client() as c:
        assert c.delete(f"/sessions/{sid}").status_code == 204
    t.join(10)
    r = out["r"]
    assert r.status_code == 200 and "destroyed" in r.json()["result_block"]["content"]["stderr"]


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


def test_sandboxed_code_cannot_reach_this_servers_port(
    client: httpx.Client, session_id: str, server: Server
) -> None:
    content = run(
        client, session_id, "code_execution",
        code=f"import socket\ns = socket.socket(); s.settimeout(2)\ntry:\n    s.connect(('127.0.0.1', {server.port})); print('CONNECTED')\nexcept OSError as e:\n    print('refused', e.errno)",
    )  # fmt: skip
    assert content["stdout"].startswith("refused")
