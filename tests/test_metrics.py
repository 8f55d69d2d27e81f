"""GET /metrics: the counters move as the work happens, behind the exec tokens when set."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import Server, data_dir
from tests.tiers import needs

TOKEN = "metrics-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
@needs("root")
def server() -> Iterator[Server]:
    with data_dir() as d:
        srv = Server(d, max_sessions=1, exec_tokens=TOKEN, output_limit_bytes=1024).start()
        try:
            yield srv
        finally:
            srv.stop()


def sample(server: Server, name: str, **labels: str) -> float:
    """The value of one sample (0 when it has not appeared yet)."""
    text = httpx.get(server.base_url + "/metrics", headers=AUTH).text
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


def test_metrics_need_a_token_when_the_api_does(server: Server) -> None:
    assert httpx.get(server.base_url + "/metrics").status_code == 401
    wrong = httpx.get(server.base_url + "/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = httpx.get(server.base_url + "/metrics", headers=AUTH)
    assert ok.status_code == 200
    assert ok.headers["content-type"].startswith("text/plain")


def test_calls_sessions_and_requests_are_counted(server: Server) -> None:
    before = {
        "ok": sample(server, "sandbank_exec_results_total", tool="python", outcome="ok"),
        "error": sample(server, "sandbank_exec_results_total", tool="python", outcome="error"),
        "timeout": sample(server, "sandbank_exec_results_total", tool="python", outcome="timeout"),
        "created": sample(server, "sandbank_sessions_created_total"),
        "destroyed": sample(server, "sandbank_sessions_destroyed_total"),
        "http": sample(
            server,
            "sandbank_http_requests_total",
            route="/sessions/{session_id}/exec",
            method="POST",
            status="200",
        ),
    }
    with server.client(headers=AUTH) as client:
        sid = client.post("/sessions", json={}).json()["session_id"]
        assert sample(server, "sandbank_sessions", state="idle") == 1
        assert sample(server, "sandbank_sessions", state="busy") == 0
        assert run(client, sid, "print(1)") == 0
        assert run(client, sid, "raise SystemExit(3)") == 3
        assert run(client, sid, "import time; time.sleep(30)", timeout=1) == 124
        assert client.delete(f"/sessions/{sid}").status_code == 204
    assert sample(server, "sandbank_exec_results_total", tool="python", outcome="ok") == (
        before["ok"] + 1
    )
    assert sample(server, "sandbank_exec_results_total", tool="python", outcome="error") == (
        before["error"] + 1
    )
    assert sample(server, "sandbank_exec_results_total", tool="python", outcome="timeout") == (
        before["timeout"] + 1
    )
    assert sample(server, "sandbank_sessions_created_total") == before["created"] + 1
    assert sample(server, "sandbank_sessions_destroyed_total") == before["destroyed"] + 1
    assert (
        sample(
            server,
            "sandbank_http_requests_total",
            route="/sessions/{session_id}/exec",
            method="POST",
            status="200",
        )
        == before["http"] + 3
    )
    assert sample(server, "sandbank_exec_seconds_count", tool="python") >= 3
    assert sample(server, "sandbank_exec_seconds_bucket", tool="python", le="+Inf") >= 3


def test_a_refused_lease_is_counted(server: Server) -> None:
    before = sample(server, "sandbank_capacity_refusals_total")
    with server.client(headers=AUTH) as client:
        sid = client.post("/sessions", json={}).json()["session_id"]
        codes: list[int] = []
        busy = threading.Thread(
            target=lambda: codes.append(run(client, sid, "import time; time.sleep(4)"))
        )
        busy.start()
        time.sleep(1)  # the call is running: the only session cannot be reclaimed
        try:
            assert sample(server, "sandbank_sessions", state="busy") == 1
            refused = client.post("/sessions", json={})
        finally:
            busy.join(30)
            client.delete(f"/sessions/{sid}")
    assert refused.status_code == 503, refused.text
    assert codes == [0]
    assert sample(server, "sandbank_capacity_refusals_total") == before + 1


def test_a_cut_output_is_counted(server: Server) -> None:
    before = sample(server, "sandbank_output_truncations_total", stream="stdout")
    with server.client(headers=AUTH) as client:
        sid = client.post("/sessions", json={}).json()["session_id"]
        assert run(client, sid, "print('x' * 5000)") == 0
        assert run(client, sid, "print('short')") == 0
        client.delete(f"/sessions/{sid}")
    assert sample(server, "sandbank_output_truncations_total", stream="stdout") == before + 1


def test_file_bytes_are_counted_by_route(server: Server) -> None:
    route = "/sessions/{session_id}/files"
    before_in = sample(server, "sandbank_http_bytes_total", route=route, direction="in")
    before_out = sample(server, "sandbank_http_bytes_total", route=route, direction="out")
    data = b"x" * 10_000
    with server.client(headers=AUTH) as client:
        sid = client.post("/sessions", json={}).json()["session_id"]
        put = client.post(
            f"/sessions/{sid}/files", files={"file": ("a.bin", data)}, data={"path": "a.bin"}
        )
        assert put.status_code == 201, put.text
        assert client.get(f"/sessions/{sid}/files", params={"path": "a.bin"}).content == data
        client.delete(f"/sessions/{sid}")
    grown_in = sample(server, "sandbank_http_bytes_total", route=route, direction="in") - before_in
    grown_out = sample(server, "sandbank_http_bytes_total", route=route, direction="out")
    assert 10_000 < grown_in < 11_000  # the file and its multipart framing
    assert grown_out - before_out >= 10_000 + len(put.content)


def test_a_restarted_interpreter_is_counted_by_reason(server: Server) -> None:
    def restarts(reason: str) -> float:
        return sample(server, "sandbank_sandbox_restarts_total", reason=reason)

    before = {r: restarts(r) for r in ("crash", "memory", "timeout")}
    with server.client(headers=AUTH) as client:
        sid = client.post("/sessions", json={}).json()["session_id"]
        assert run(client, sid, "x = 1") == 0
        assert run(client, sid, "x") == 0  # state kept: no restart yet
        assert restarts("crash") == before["crash"]
        assert run(client, sid, "import os; os.kill(os.getpid(), 9)") == 137
        assert run(client, sid, "print('fresh')") == 0  # a new interpreter answers
        assert (
            run(client, sid, "b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096])") == 137
        )
        code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"
        assert run(client, sid, code, timeout=1) == 124
        client.delete(f"/sessions/{sid}")
    assert restarts("crash") == before["crash"] + 1
    assert restarts("memory") == before["memory"] + 1
    assert restarts("timeout") == before["timeout"] + 1


def test_sandbox_memory_is_reported_with_the_fork_template_apart(server: Server) -> None:
    """The sessions' charge follows what their code holds; the template is its own part."""
    with server.client(headers=AUTH) as client:
        sid = client.post("/sessions", json={}).json()["session_id"]
        try:
            assert run(client, sid, "x = 1") == 0
            before = sample(server, "sandbank_sandbox_memory_bytes", part="sandboxes")
            assert run(client, sid, "held = b'x' * (64 << 20)") == 0  # 64 MiB, written
            after = sample(server, "sandbank_sandbox_memory_bytes", part="sandboxes")
            assert after - before >= 60 << 20
            template = sample(server, "sandbank_sandbox_memory_bytes", part="template")
            assert template > 20 << 20  # the data stack, imported once and shared
            assert run(client, sid, "del held") == 0
        finally:
            client.delete(f"/sessions/{sid}")
