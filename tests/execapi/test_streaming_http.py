"""A streamed Execute's framing over fakes: `text/event-stream`, its events in order, then the
plain call's result; display bundles in the result. test_streaming.py keeps, on a real server,
what needs code that really runs (output as it comes, a client that leaves mid-call).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from sandbank.protocol.calls import ExecResult, PythonCall, ToolCall
from tests.execapi.conftest import Contract, run
from tests.fakeapp import FakeApp, canned

TABLE = {"data": {"text/plain": "   a\n0  1", "text/html": "<table><tr><td>1</td></tr></table>"}}


async def answer(call: ToolCall, workspace: Path) -> ExecResult:
    """`talk` prints on both streams and shows a table; `show` shows one; the rest is canned."""
    if isinstance(call, PythonCall) and call.code == "talk":
        return ExecResult(stdout="0\n1\n2\n", stderr="careful\n", displays=[TABLE])
    if isinstance(call, PythonCall) and call.code == "show":
        return ExecResult(displays=[TABLE])
    return await canned(call, workspace)


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with FakeApp(answer).running() as http:
        yield http


def frames(response: httpx.Response) -> list[tuple[str, Any]]:
    """Each event's name and data; every event is `event:` then `data:` then a blank line."""
    text = response.read().decode()
    assert text.endswith("\n\n")
    found = []
    for block in text.split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: ")
        found.append((lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])))
    return found


def test_a_streamed_call_is_its_events_then_the_result(
    client: httpx.Client, session_id: str, contract: Contract
) -> None:
    body = {"tool": "code_execution", "input": {"code": "talk"}, "tool_use_id": "t-9"}
    with client.stream(
        "POST", f"/sessions/{session_id}/exec", json=body, headers={"Accept": "text/event-stream"}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        got = frames(r)
    assert got[:3] == [
        ("stdout", {"text": "0\n1\n2\n"}),
        ("stderr", {"text": "careful\n"}),
        ("display", TABLE),
    ]
    kind, final = got[-1]
    assert kind == "result" and len(got) == 4
    root = {"$ref": "#/components/schemas/ExecResponse", "components": contract.spec["components"]}
    jsonschema.Draft202012Validator(root).validate(final)
    assert final["tool_use_id"] == "t-9"
    assert final["result_block"]["content"]["stdout"] == "0\n1\n2\n"
    plain = client.post(f"/sessions/{session_id}/exec", json=body)  # the plain call is as before
    assert plain.headers["content-type"] == "application/json"
    assert plain.json()["result_block"] == final["result_block"]


def test_a_streamed_call_on_an_unknown_session_is_a_plain_404(client: httpx.Client) -> None:
    r = client.post(
        "/sessions/no-such-session/exec",
        json={"tool": "code_execution", "input": {"code": "1"}},
        headers={"Accept": "text/event-stream"},
    )
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"


def test_display_outputs_are_in_the_result(client: httpx.Client, session_id: str) -> None:
    out = run(client, session_id, "code_execution", code="show")
    assert "<table" in out["display_outputs"][0]["data"]["text/html"]
    assert "display_outputs" not in run(client, session_id, "code_execution", code="print(1)")
