"""Two tenants at the ceiling of a server: one keeping all its sessions busy never keeps the
other out, and a refusal names the limit it hit.

Admission is the server's (sandbox/local.py): the app runs in-process over fakes
(tests/fakeapp.py), each busy call held until the test lets it go.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandbank.protocol.calls import BashCall, ExecResult, ToolCall
from tests.fakeapp import FakeApp, canned

GREEDY, QUIET = "greedy-tenant-token-1", "quiet-tenant-token-2"
released = threading.Event()


async def held(call: ToolCall, workspace: Path) -> ExecResult:
    """`sleep` lasts until the test releases it; the rest is canned."""
    if isinstance(call, BashCall) and call.command == "sleep":
        await asyncio.to_thread(released.wait, 30)
        return ExecResult()
    return await canned(call, workspace)


@pytest.fixture(scope="module")
def two_tenants() -> Iterator[FakeApp]:
    fake = FakeApp(held, max_sessions=4, exec_tokens=f"{GREEDY},{QUIET}")
    with fake.running():
        yield fake


def test_a_tenant_keeping_every_session_busy_leaves_the_others_room(two_tenants: FakeApp) -> None:
    greedy = two_tenants.client(headers={"Authorization": f"Bearer {GREEDY}"})
    quiet = two_tenants.client(headers={"Authorization": f"Bearer {QUIET}"})
    with greedy as greedy_http, quiet as quiet_http:
        # Its share: three quarters of 4 (a fourth would take the place of an idle one).
        mine = [greedy_http.post("/sessions", json={}).json()["session_id"] for _ in range(3)]
        released.clear()
        answers: list[httpx.Response] = []

        def busy(sid: str) -> None:
            answers.append(
                greedy_http.post(
                    f"/sessions/{sid}/exec",
                    json={"tool": "bash_code_execution", "input": {"command": "sleep"}},
                )
            )

        threads = [threading.Thread(target=busy, args=(sid,)) for sid in mine]
        for thread in threads:
            thread.start()
        try:
            while not all(
                getattr(s.sandbox, "calls", ()) for s in two_tenants.sandboxes.sessions()
            ):
                released.wait(0.01)  # every call under way
            again = greedy_http.post("/sessions", json={})
            assert again.status_code == 503 and again.headers["retry-after"] == "5"
            assert "the most it may hold (3: three quarters of the server's 4)" in again.text
            r = quiet_http.post("/sessions", json={})
            assert r.status_code == 201, r.text
            sid = r.json()["session_id"]
            done = quiet_http.post(
                f"/sessions/{sid}/exec",
                json={"tool": "code_execution", "input": {"code": "print(42)"}},
            )
            assert done.json()["result_block"]["content"]["stdout"] == "42\n"
        finally:
            released.set()
            for thread in threads:
                thread.join()
        assert [a.status_code for a in answers] == [200, 200, 200]
