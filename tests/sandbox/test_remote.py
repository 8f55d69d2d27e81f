"""The remote sandbox client: its start-up probe, and how it maps calls and errors."""

from __future__ import annotations

import json

import httpx
import pytest

from sandbank.config import Settings
from sandbank.errors import AtCapacity, SandboxError, SessionNotFound
from sandbank.protocol.calls import BashCall, EditorCall, PythonCall
from sandbank.protocol.codec import encode_call as to_request
from sandbank.sandbox.port import exists
from sandbank.sandbox.remote import RemoteSandboxes


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def backend(serves_files: bool, seen: list[str]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.method == "POST" and request.url.path == "/sessions":
            return httpx.Response(201, json={"session_id": "s1"})
        if request.method == "DELETE":
            return httpx.Response(204)
        if request.url.path.startswith("/sessions/s1/files") and serves_files:
            if request.url.path.endswith("/list"):
                return httpx.Response(200, json={"files": [], "truncated": False})
            return httpx.Response(400, json={"detail": "is a directory"})
        if request.url.path == "/sessions/s1/exec":
            return httpx.Response(503, json={"detail": "full"}, headers={"Retry-After": "7"})
        return httpx.Response(404, json={"detail": "not found"})

    return httpx.MockTransport(handle)


def settings() -> Settings:
    return Settings(sandbox_url="http://backend.test", sandbox_token="t")


@pytest.mark.anyio
async def test_start_refuses_a_backend_without_file_operations() -> None:
    seen: list[str] = []
    client = RemoteSandboxes(settings(), transport=backend(serves_files=False, seen=seen))
    with pytest.raises(SandboxError, match="file operations"):
        await client.start()
    assert seen[-1] == "DELETE /sessions/s1"  # the probe's session is not left behind
    await client.close()


@pytest.mark.anyio
async def test_start_accepts_a_backend_with_file_operations_and_maps_errors() -> None:
    seen: list[str] = []
    client = RemoteSandboxes(settings(), transport=backend(serves_files=True, seen=seen))
    await client.start()
    assert "GET /sessions/s1/files/list" in seen
    with pytest.raises(AtCapacity) as capacity:
        await client.execute("s1", "", PythonCall("1"), 5)
    assert capacity.value.retry_after == 7
    with pytest.raises(SessionNotFound):
        await client.execute("gone", "", PythonCall("1"), 5)
    assert not await exists(client, "gone", "")
    await client.close()


def test_calls_map_to_the_protocol() -> None:
    assert to_request(PythonCall("print(1)"), 9.6) == {
        "tool": "code_execution",
        "input": {"code": "print(1)"},
        "timeout_seconds": 10,
    }
    assert to_request(BashCall("ls"), 1)["tool"] == "bash_code_execution"
    edit = to_request(EditorCall("view", "a.txt", view_range=(1, 3)), 1)
    assert json.loads(json.dumps(edit))["input"] == {
        "command": "view",
        "path": "a.txt",
        "view_range": [1, 3],
    }
