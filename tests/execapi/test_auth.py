"""Bearer tokens: every operation needs one; each token is a tenant; capacity answers 503."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandbank.app import check_exposure
from sandbank.config import Settings
from sandbank.errors import SandbankError
from tests.execapi.conftest import Contract
from tests.support import Server, data_dir
from tests.tiers import needs

TOKENS = "tok-alice-0123456789,tok-bob-9876543210"


@pytest.fixture(scope="module")
@needs("root")
def server() -> Iterator[Server]:
    with data_dir() as d:
        srv = Server(d, exec_tokens=TOKENS, max_sessions=2).start()
        try:
            yield srv
        finally:
            srv.stop()


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


@pytest.mark.parametrize(("method", "path", "kwargs"), OPERATIONS)
@pytest.mark.parametrize("token", [None, "wrong-token", "Basic abc"])
def test_every_operation_requires_a_valid_token(
    server: Server,
    contract: Contract,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    token: str | None,
) -> None:
    with server.client() as c:
        sid = c.post("/sessions", headers=as_("tok-alice-0123456789")).json()["session_id"]
        headers = {"Authorization": token} if token and token.startswith("Basic") else as_(token)
        r = c.request(method, path.format(sid=sid), headers=headers, **kwargs)
        assert r.status_code == 401, (method, path, r.status_code)
        contract.check(r, "Error")
        c.delete(f"/sessions/{sid}", headers=as_("tok-alice-0123456789"))


def test_a_session_of_one_token_does_not_exist_for_another(server: Server) -> None:
    alice, bob = as_("tok-alice-0123456789"), as_("tok-bob-9876543210")
    with server.client() as c:
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


def test_at_capacity_is_503_with_retry_after(server: Server, contract: Contract) -> None:
    alice = as_("tok-alice-0123456789")
    with server.client() as c:
        sids = [c.post("/sessions", headers=alice).json()["session_id"] for _ in range(2)]

    def busy(sid: str) -> None:
        with server.client() as c:
            c.post(
                f"/sessions/{sid}/exec",
                headers=alice,
                json={"tool": "code_execution", "input": {"code": "import time; time.sleep(2)"}},
            )

    threads = [threading.Thread(target=busy, args=(s,)) for s in sids]
    for t in threads:
        t.start()
    time.sleep(0.7)
    with server.client() as c:
        r = c.post("/sessions", headers=alice)
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
        contract.check(r, "Error")
    for t in threads:
        t.join()
    with server.client() as c:
        r = c.post("/sessions", headers=alice)  # idle again: the LRU one is reclaimed
        assert r.status_code == 201
        for sid in [*sids, r.json()["session_id"]]:
            c.delete(f"/sessions/{sid}", headers=alice)


def test_refuses_to_expose_an_unauthenticated_api_beyond_loopback() -> None:
    with pytest.raises(SandbankError, match="without tokens"):
        check_exposure(Settings(host="0.0.0.0"), [])
    check_exposure(Settings(host="0.0.0.0"), ["t"])
    check_exposure(Settings(host="0.0.0.0", exec_api="off"), [])
    check_exposure(Settings(host="127.0.0.1"), [])


def test_serve_on_a_public_address_without_tokens_exits_saying_why(machine: None) -> None:
    with data_dir() as d:
        srv = Server(d, host="0.0.0.0")
        with pytest.raises(RuntimeError, match="refusing to serve the code-execution API"):
            srv.start(timeout=20)


def test_sigterm_ends_running_calls_with_a_result_and_removes_everything(machine: None) -> None:
    with data_dir() as d:
        srv = Server(d).start()
        with srv.client() as c:
            sid = c.post("/sessions").json()["session_id"]
        out: dict[str, httpx.Response] = {}

        def call() -> None:
            with srv.client() as c:
                out["r"] = c.post(
                    f"/sessions/{sid}/exec",
                    json={
                        "tool": "code_execution",
                        "input": {"code": "import time; time.sleep(60)"},
                    },
                )

        t = threading.Thread(target=call)
        t.start()
        time.sleep(1)
        t0 = time.monotonic()
        assert srv.stop() in (0, -15)  # uvicorn re-raises the signal after a clean shutdown
        assert time.monotonic() - t0 < 15
        t.join(5)
        r = out["r"]
        assert r.status_code == 200 and r.json()["result_block"]["content"]["return_code"] != 0
        assert list((d / "sandboxes").iterdir()) == []
        from sandbank.sandbox.backends.base import instance_id
        from sandbank.sandbox.host import cgroups, disk

        inst = instance_id(d)
        assert not (cgroups.ROOT / "memory" / "sandbank" / inst).exists()
        assert disk.mounts_under(d) == []


def test_the_api_can_have_a_listener_of_its_own(machine: None) -> None:
    from tests.support import free_port

    port = free_port()
    with data_dir() as d:
        srv = Server(d, exec_api="separate", exec_api_port=port).start()
        try:
            with srv.client() as main:
                assert main.post("/sessions").status_code == 404  # not on the main listener
                assert main.get("/api/openapi.json").status_code == 200
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
                sid = c.post("/sessions").json()["session_id"]
                r = c.post(
                    f"/sessions/{sid}/exec",
                    json={"tool": "code_execution", "input": {"code": "print(3)"}},
                )
                assert r.json()["result_block"]["content"]["stdout"] == "3\n"
                assert c.get("/openapi.json").status_code == 200
        finally:
            assert srv.stop() in (0, -15)
    with pytest.raises(SandbankError, match="without tokens"):
        check_exposure(Settings(exec_api="separate", exec_api_host="0.0.0.0"), [])
    check_exposure(Settings(host="0.0.0.0", exec_api="separate"), [])  # /api public, exec local
