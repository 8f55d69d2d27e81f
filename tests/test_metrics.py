"""GET /metrics on a real server: what only real sandboxes move (restarts by reason, their
memory). The HTTP work's counters are tested over fakes in test_metrics_http.py.
"""

from __future__ import annotations

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


def test_the_served_heap_is_frozen_and_its_size_reported(server: Server) -> None:
    """The server froze what start-up made (heap.py): its full collections are counted and the
    frozen heap (the SDKs, the routes, ~100,000s of objects) is a gauge."""
    assert sample(server, "sandbank_heap_full_collections") >= 1
    assert sample(server, "sandbank_heap_frozen_objects") > 50_000
