"""Exposure and a real server's life with tokens: refusing to serve the API unauthenticated
beyond loopback, SIGTERM during a call, a listener of its own. What tokens do to each
operation is tested over fakes in test_auth_http.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from sandbank.config import Settings
from sandbank.errors import SandbankError
from sandbank.startup import check_exposure
from tests.support import Server, data_dir


def test_refuses_to_expose_an_unauthenticated_api_beyond_loopback() -> None:
    with pytest.raises(SandbankError, match="without SANDBANK_EXEC_TOKENS"):
        check_exposure(Settings(host="0.0.0.0"), [])
    assert check_exposure(Settings(host="0.0.0.0"), ["t"]) == []
    assert check_exposure(Settings(host="0.0.0.0", exec_api="off"), []) == []
    assert check_exposure(Settings(host="127.0.0.1"), []) == []
    assert check_exposure(Settings(host="::1"), []) == []


def test_only_an_explicit_setting_serves_without_credentials_beyond_loopback() -> None:
    (warning,) = check_exposure(Settings(host="0.0.0.0", allow_unauthenticated=True), [])
    assert "anyone who reaches it is let in" in warning
    assert "SANDBANK_ALLOW_UNAUTHENTICATED=1" in warning


def test_a_user_header_believed_from_anywhere_is_no_authentication() -> None:
    wide: dict[str, Any] = {
        "trusted_user_header": "X-User",
        "trusted_proxies": "10.0.0.0/8,0.0.0.0/0",
    }
    with pytest.raises(SandbankError, match="believing X-User from any address"):
        check_exposure(Settings(host="0.0.0.0", exec_api="off", **wide), [])
    narrow = {**wide, "trusted_proxies": "10.0.0.7/32"}
    assert check_exposure(Settings(host="0.0.0.0", exec_api="off", **narrow), []) == []
    assert check_exposure(Settings(host="127.0.0.1", exec_api="off", **wide), []) == []


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
        content = r.json()["result_block"]["content"]
        assert r.status_code == 200 and content["return_code"] == 137
        assert content["stderr"] == (
            "[sandbank] the server is restarting: this session ended with it (its state is "
            "lost); retry in a new session\n"
        )
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
