"""Conformance to contract v1 where the subject is real execution: state across calls, timeouts,
produced files, files owned by the sandbox's user, concurrency, the sandbox's network. Every
response validated against the contract's schemas. The HTTP behaviour alone (shapes, status
codes, error bodies, what the file routes do with links and pipes a program left) is tested
over fakes in test_http_contract.py.
"""

from __future__ import annotations

import itertools
import json
import threading

import httpx

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


def test_sandboxed_code_cannot_reach_this_servers_port(
    client: httpx.Client, session_id: str, server: Server
) -> None:
    content = run(
        client, session_id, "code_execution",
        code=f"import socket\ns = socket.socket(); s.settimeout(2)\ntry:\n    s.connect(('127.0.0.1', {server.port})); print('CONNECTED')\nexcept OSError as e:\n    print('refused', e.errno)",
    )  # fmt: skip
    assert content["stdout"].startswith("refused")
