"""A streamed Execute over HTTP on a real server: output as it comes, then the plain call's
result; a client that leaves. The framing alone is tested over fakes in test_streaming_http.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jsonschema

from tests.execapi.conftest import Contract, run

SLOW = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.5)\ndone = True"


def events(response: httpx.Response) -> list[tuple[float, str, Any]]:
    found = []
    started = time.monotonic()
    kind = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            found.append((time.monotonic() - started, kind, json.loads(line[len("data: ") :])))
    return found


def test_output_arrives_while_the_call_runs_and_ends_with_the_result(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    body = {"tool": "code_execution", "input": {"code": SLOW}}
    with client.stream(
        "POST", f"/sessions/{session_id}/exec", json=body, headers={"Accept": "text/event-stream"}
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        got = events(r)
    kinds = [k for _, k, _ in got]
    assert kinds[-1] == "result" and kinds.count("stdout") >= 1
    first_out = next(t for t, k, _ in got if k == "stdout")
    assert first_out < got[-1][0] - 0.7  # the first line long before the end
    final = got[-1][2]
    assert final["result_block"]["content"]["stdout"] == "0\n1\n2\n"
    root = {"$ref": "#/components/schemas/ExecResponse", "components": contract.spec["components"]}
    jsonschema.Draft202012Validator(root).validate(final)
    plain = client.post(f"/sessions/{session_id}/exec", json=body)  # the plain call is as before
    assert plain.headers["content-type"] == "application/json"


def test_a_client_gone_mid_stream_interrupts_nothing(client: httpx.Client, session_id: str) -> None:
    body = {"tool": "code_execution", "input": {"code": SLOW}}
    with client.stream(
        "POST", f"/sessions/{session_id}/exec", json=body, headers={"Accept": "text/event-stream"}
    ) as r:
        next(r.iter_lines())  # one event, then the client leaves
    out = run(client, session_id, "code_execution", code="print(done)")  # waits for it, in order
    assert out["stdout"] == "True\n"


def test_a_client_may_ask_to_interrupt_on_disconnect(client: httpx.Client, session_id: str) -> None:
    code = "import time\nprint('start', flush=True)\ntime.sleep(20)\nfinished = True"
    with client.stream(
        "POST",
        f"/sessions/{session_id}/exec",
        params={"on_disconnect": "interrupt"},
        json={"tool": "code_execution", "input": {"code": code}},
        headers={"Accept": "text/event-stream"},
    ) as r:
        next(r.iter_lines())
    started = time.monotonic()
    out = run(client, session_id, "code_execution", code="print('finished' in globals())")
    assert out["stdout"] == "False\n" and time.monotonic() - started < 10
