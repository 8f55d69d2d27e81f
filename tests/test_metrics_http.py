"""GET /metrics over fakes: the counters move as the HTTP work happens, behind the exec tokens.

The app runs in-process on the fake backend (tests/fakeapp.py); test_metrics.py keeps, on a real
server, what needs real sandboxes (restarts by reason, the sandboxes' memory).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandbank.protocol.calls import ExecResult, PythonCall, ToolCall
from tests.fakeapp import CUT, FakeApp, canned

TOKEN = "metrics-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 1024
released = threading.Event()


async def answer(call: ToolCall, workspace: Path) -> ExecResult:
    """`wait` holds the call until released; `print('x' * 5000)` is cut as the worker cuts it."""
    if isinstance(call, PythonCall) and call.code == "wait":
        await asyncio.to_thread(released.wait, 30)
        return ExecResult()
    if isinstance(call, PythonCall) and call.code == "print('x' * 5000)":
        return ExecResult(stdout="x" * LIMIT + CUT.format(5001 - LIMIT))
    return await canned(call, workspace)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeApp]:
    made = FakeApp(answer, max_sessions=1, exec_tokens=TOKEN, output_limit_bytes=LIMIT)
    with made.running():
        yield made


@pytest.fixture(scope="module")
def client(fake: FakeApp) -> Iterator[httpx.Client]:
    with fake.client(headers=AUTH) as c:
        yield c


def sample(fake: FakeApp, name: str, **labels: str) -> float:
    """The value of one sample (0 when it has not appeared yet)."""
    with fake.client(headers=AUTH) as c:
        text = c.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def run(client: httpx.Client, sid: str, code: str, timeout: int = 10) -> int:
    body = {"tool": "code_execution", "input": {"code": code}, "timeout_seconds": timeout}
    response = client.post(f"/sessions/{sid}/exec", json=body)
    assert response.status_code == 200, response.text
    return int(response.json()["result_block"]["content"]["return_code"])


def test_metrics_need_a_token_when_the_api_does(fake: FakeApp) -> None:
    with fake.client() as anonymous:
        assert anonymous.get("/metrics").status_code == 401
        wrong = anonymous.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = anonymous.get("/metrics", headers=AUTH)
    assert ok.status_code == 200
    assert ok.headers["content-type"].startswith("text/plain")


def test_calls_sessions_and_requests_are_counted(fake: FakeApp, client: httpx.Client) -> None:
    before = {
        "ok": sample(fake, "sandbank_exec_results_total", tool="python", outcome="ok"),
        "error": sample(fake, "sandbank_exec_results_total", tool="python", outcome="error"),
        "timeout": sample(fake, "sandbank_exec_results_total", tool="python", outcome="timeout"),
        "created": sample(fake, "sandbank_sessions_created_total"),
        "destroyed": sample(fake, "sandbank_sessions_destroyed_total"),
        "http": sample(
            fake,
            "sandbank_http_requests_total",
            route="/sessions/{session_id}/exec",
            method="POST",
            status="200",
        ),
    }
    sid = client.post("/sessions", json={}).json()["session_id"]
    assert sample(fake, "sandbank_sessions", state="idle") == 1
    assert sample(fake, "sandbank_sessions", state="busy") == 0
    assert run(client, sid, "print(1)") == 0
    assert run(client, sid, "raise SystemExit(3)") == 3
    assert run(client, sid, "import time; time.sleep(30)", timeout=1) == 124
    assert client.delete(f"/sessions/{sid}").status_code == 204
    assert sample(fake, "sandbank_exec_results_total", tool="python", outcome="ok") == (
        before["ok"] + 1
    )
    assert sample(fake, "sandbank_exec_results_total", tool="python", outcome="error") == (
        before["error"] + 1
    )
    assert sample(fake, "sandbank_exec_results_total", tool="python", outcome="timeout") == (
        before["timeout"] + 1
    )
    assert sample(fake, "sandbank_sessions_created_total") == before["created"] + 1
    assert sample(fake, "sandbank_sessions_destroyed_total") == before["destroyed"] + 1
    assert (
        sample(
            fake,
            "sandbank_http_requests_total",
            route="/sessions/{session_id}/exec",
            method="POST",
            status="200",
        )
        == before["http"] + 3
    )
    assert sample(fake, "sandbank_exec_seconds_count", tool="python") >= 3
    assert sample(fake, "sandbank_exec_seconds_bucket", tool="python", le="+Inf") >= 3


def test_a_refused_lease_is_counted(fake: FakeApp, client: httpx.Client) -> None:
    before = sample(fake, "sandbank_capacity_refusals_total")
    sid = client.post("/sessions", json={}).json()["session_id"]
    codes: list[int] = []
    released.clear()
    busy = threading.Thread(target=lambda: codes.append(run(client, sid, "wait")))
    busy.start()
    try:
        while sample(fake, "sandbank_sessions", state="busy") != 1:
            released.wait(0.01)  # the call is running: the only session cannot be reclaimed
        refused = client.post("/sessions", json={})
    finally:
        released.set()
        busy.join(30)
        client.delete(f"/sessions/{sid}")
    assert refused.status_code == 503, refused.text
    assert codes == [0]
    assert sample(fake, "sandbank_capacity_refusals_total") == before + 1


def test_a_cut_output_is_counted(fake: FakeApp, client: httpx.Client) -> None:
    before = sample(fake, "sandbank_output_truncations_total", stream="stdout")
    sid = client.post("/sessions", json={}).json()["session_id"]
    assert run(client, sid, "print('x' * 5000)") == 0
    assert run(client, sid, "print('short')") == 0
    client.delete(f"/sessions/{sid}")
    assert sample(fake, "sandbank_output_truncations_total", stream="stdout") == before + 1


def test_file_bytes_are_counted_by_route(fake: FakeApp, client: httpx.Client) -> None:
    route = "/sessions/{session_id}/files"
    before_in = sample(fake, "sandbank_http_bytes_total", route=route, direction="in")
    before_out = sample(fake, "sandbank_http_bytes_total", route=route, direction="out")
    data = b"x" * 10_000
    sid = client.post("/sessions", json={}).json()["session_id"]
    put = client.post(
        f"/sessions/{sid}/files", files={"file": ("a.bin", data)}, data={"path": "a.bin"}
    )
    assert put.status_code == 201, put.text
    assert client.get(f"/sessions/{sid}/files", params={"path": "a.bin"}).content == data
    client.delete(f"/sessions/{sid}")
    grown_in = sample(fake, "sandbank_http_bytes_total", route=route, direction="in") - before_in
    grown_out = sample(fake, "sandbank_http_bytes_total", route=route, direction="out")
    assert 10_000 < grown_in < 11_000  # the file and its multipart framing
    assert grown_out - before_out >= 10_000 + len(put.content)
