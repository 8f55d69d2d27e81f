"""A remote backend answering outside the protocol is a `ProtocolError`, never a KeyError."""

from __future__ import annotations

import httpx
import pytest

from sandbank.errors import ProtocolError
from sandbank.protocol.calls import PythonCall
from sandbank.sandbox.remote import RemoteSandboxes
from tests.support import settings

pytestmark = pytest.mark.anyio


def backend(body: object, tmp_path: object) -> RemoteSandboxes:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200 if request.method != "POST" else 201, json=body)

    config = settings(tmp_path, sandbox_url="http://backend.invalid")  # type: ignore[arg-type]
    return RemoteSandboxes(config, transport=httpx.MockTransport(answer))


@pytest.mark.parametrize("body", [{}, {"session": 1}, [1, 2], {"files": [{"size_bytes": 1}]}])
async def test_malformed_replies_are_protocol_errors(body: object, tmp_path: object) -> None:
    remote = backend(body, tmp_path)
    try:
        with pytest.raises(ProtocolError):
            await remote.create("o")
        with pytest.raises(ProtocolError):
            await remote.execute("s", "o", PythonCall("1"), 5)
        if isinstance(body, dict) and "files" in body:
            with pytest.raises(ProtocolError):
                await remote.list_files("s", "o", ".", 10)
    finally:
        await remote.close()
