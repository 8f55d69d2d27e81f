"""Bearer tokens over fakes: every operation needs one; each token is a tenant; capacity is 503.

The app runs in-process on the fake backend (tests/fakeapp.py); test_auth.py keeps what needs a
real `sandbank serve` (refusing to start, SIGTERM, a listener of its own).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbank.app import create_exec_app
from sandbank.config import Settings
from sandbank.errors import SandbankError
from sandbank.protocol.calls import ExecResult, PythonCall, ToolCall
from sandbank.startup import check_exposure
from tests.execapi.conftest import Contract
from tests.fakeapp import FakeApp, canned

TOKENS = "tok-alice-0123456789,tok-bob-9876543210"


def as_(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


OPERATIONS = [
    ("POST", "/sessions", {"json": {}}),
    ("DELETE", "/sessions/{sid}", {}),
    ("POST", "/sessions/{sid}/exec", {"json": {"tool": "code_execution", "input": {"code": "1"}}}),
    ("GET", "/sessions/{sid}/files/list", {}),
    ("GET", "/sessions/{sid}/files", {"params": {"path": "a"}}),
    ("POST", "/sessions/{sid}/files", {"files": {"file": ("a", b"x")}}),
]


released = threading.Event()


async def gated(call: ToolCall, workspace: Path) -> ExecResult:
    """`wait` holds the call until the test releases it; the rest is canned."""
    if isinstance(call, PythonCall) and call.code == "wait":
        await asyncio.to_thread(released.wait, 30)
        return ExecResult()
    return await canned(call, workspace)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeApp]:
    made = FakeApp(gated, exec_tokens=TOKENS, max_sessions=2)
    with made.running():
        yield made


@pytest.fixture(scope="module")
def client(fake: FakeApp) -> httpx.Client:
    assert fake.http is not None
    return fake.http


def started(fake: FakeApp, sids: list[str]) -> bool:
    """Whether a call has reached the sandbox of every one of these sessions."""
    calls = {s.id: bool(getattr(s.sandbox, "calls", ())) for s in fake.sandboxes.sessions()}
    return all(calls.get(sid) for sid in sids)


@pytest.mark.parametrize(("method", "path", "kwargs"), OPERATIONS)
@pytest.mark.parametrize("token", [None, "wrong-token", "Basic abc"])
def test_every_operation_requires_a_valid_token(
    client: httpx.Client,
    contract: Contract,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    token: str | None,
) -> None:
    c = client
    sid = c.post("/sessions", headers=as_("tok-alice-0123456789")).json()["session_id"]
    headers = {"Authorization": token} if token and token.startswith("Basic") else as_(token)
    r = c.request(method, path.format(sid=sid), headers=headers, **kwargs)
    assert r.status_code == 401, (method, path, r.status_code)
    contract.check(r, "Error")
    c.delete(f"/sessions/{sid}", headers=as_("tok-alice-0123456789"))


def test_a_session_of_one_token_does_not_exist_for_another(client: httpx.Client) -> None:
    alice, bob = as_("tok-alice-0123456789"), as_("tok-bob-9876543210")
    c = client
    sid = c.post("/sessions", headers=alice).json()["session_id"]
    r = c.post(
        f"/sessions/{sid}/exec",
        headers=bob,
        json={"tool": "code_execution", "input": {"code": "1"}},
    )
    assert r.status_code == 404
    assert c.get(f"/sessions/{sid}/files/list", headers=bob).status_code == 404
    assert c.delete(f"/sessions/{sid}", headers=bob).status_code == 204  # a no-op for bob
    r = c.post(
        f"/sessions/{sid}/exec",
        headers=alice,
        json={"tool": "code_execution", "input": {"code": "print(1)"}},
    )
    assert r.status_code == 200 and r.json()["result_block"]["content"]["stdout"] == "1\n"
    c.delete(f"/sessions/{sid}", headers=alice)


def test_at_capacity_is_503_with_retry_after(
    fake: FakeApp, client: httpx.Client, contract: Contract
) -> None:
    alice, bob = as_("tok-alice-0123456789"), as_("tok-bob-9876543210")
    c = client
    # Each token's share of 2 is one session: one each fills the server.
    owners = [alice, bob]
    sids = [c.post("/sessions", headers=who).json()["session_id"] for who in owners]
    released.clear()

    def busy(sid: str, who: dict[str, str]) -> None:
        c.post(
            f"/sessions/{sid}/exec",
            headers=who,
            json={"tool": "code_execution", "input": {"code": "wait"}},
        )

    threads = [threading.Thread(target=busy, args=pair) for pair in zip(sids, owners, strict=True)]
    for t in threads:
        t.start()
    try:
        while not started(fake, sids):
            released.wait(0.01)
        r = c.post("/sessions", headers=alice)
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
        contract.check(r, "Error")
    finally:
        released.set()
        for t in threads:
            t.join()
    r = c.post("/sessions", headers=alice)  # idle again: alice's own is reclaimed
    assert r.status_code == 201
    for sid, who in [*zip(sids, owners, strict=True), (r.json()["session_id"], alice)]:
        c.delete(f"/sessions/{sid}", headers=who)


def test_the_api_on_a_listener_of_its_own_is_not_on_the_main_one() -> None:
    """`SANDBANK_EXEC_API=separate`: the main app serves /api, the exec app /sessions, both
    over one set of services (test_auth.py serves them on two real ports)."""
    fake = FakeApp(exec_api="separate")
    with fake.running() as main:
        assert main.post("/sessions").status_code == 404
        assert main.get("/api/openapi.json").status_code == 200
        exec_app = create_exec_app(fake.app.state.services, fake.settings)
        with fake.client(exec_app) as c:
            sid = c.post("/sessions").json()["session_id"]
            r = c.post(
                f"/sessions/{sid}/exec",
                json={"tool": "code_execution", "input": {"code": "print(3)"}},
            )
            assert r.json()["result_block"]["content"]["stdout"] == "3\n"
            assert c.get("/openapi.json").status_code == 200
            assert c.get("/api/openapi.json").status_code == 404
    with pytest.raises(SandbankError, match="without SANDBANK_EXEC_TOKENS"):
        check_exposure(Settings(exec_api="separate", exec_api_host="0.0.0.0"), [])
    check_exposure(Settings(host="0.0.0.0", exec_api="separate"), [])  # /api public, exec local
