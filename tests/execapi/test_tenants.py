"""Two tenants at the ceiling of a real server: one keeping all its sessions busy never keeps
the other out, and a refusal names the limit it hit."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.support import Server, data_dir
from tests.tiers import needs

GREEDY, QUIET = "greedy-tenant-token-1", "quiet-tenant-token-2"


@pytest.fixture(scope="module")
@needs("root")
def two_tenants() -> Iterator[Server]:
    with data_dir() as d:
        srv = Server(d, max_sessions=4, exec_tokens=f"{GREEDY},{QUIET}").start()
        try:
            yield srv
        finally:
            srv.stop()


def test_a_tenant_keeping_every_session_busy_leaves_the_others_room(two_tenants: Server) -> None:
    greedy = two_tenants.client(headers={"Authorization": f"Bearer {GREEDY}"})
    quiet = two_tenants.client(headers={"Authorization": f"Bearer {QUIET}"})
    with greedy, quiet:
        # Its share: three quarters of 4 (a fourth would take the place of an idle one).
        mine = [greedy.post("/sessions", json={}).json()["session_id"] for _ in range(3)]
        busy = [
            threading.Thread(
                target=lambda sid=sid: greedy.post(
                    f"/sessions/{sid}/exec",
                    json={"tool": "bash_code_execution", "input": {"command": "sleep 6"}},
                    timeout=30,
                )
            )
            for sid in mine
        ]
        for thread in busy:
            thread.start()
        time.sleep(1.5)  # every call under way
        try:
            again = greedy.post("/sessions", json={})
            assert again.status_code == 503 and again.headers["retry-after"] == "5"
            assert "the most it may hold (3: three quarters of the server's 4)" in again.text
            r = quiet.post("/sessions", json={})
            assert r.status_code == 201, r.text
            sid = r.json()["session_id"]
            done = quiet.post(
                f"/sessions/{sid}/exec",
                json={"tool": "code_execution", "input": {"code": "print(6 * 7)"}},
            )
            assert done.json()["result_block"]["content"]["stdout"] == "42\n"
        finally:
            for thread in busy:
                thread.join()
