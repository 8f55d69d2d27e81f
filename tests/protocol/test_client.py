"""The protocol's client (protocol/client.py), in-process: error mapping, SSE parsing, multipart
encoding over httpx's MockTransport, and a round trip against the app over fakes served on
loopback (what the routes encode, the client decodes)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from sandbank.errors import (
    AtCapacity,
    PayloadTooLarge,
    ProtocolError,
    SandboxError,
    SessionNotFound,
)
from sandbank.protocol.calls import Display, Done, ExecResult, Output, PythonCall
from sandbank.protocol.client import ExecClient, HttpxTransport
from sandbank.protocol.http1 import TransportFailed
from tests.fakeapp import FakeApp

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def client_of(handler: Handler, authorization: str | None = None) -> ExecClient:
    transport = HttpxTransport("http://backend.test", 10, transport=httpx.MockTransport(handler))
    return ExecClient(transport, authorization)


def answer(status: int, body: Any = None, **headers: str) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.Response(status, content=content, headers=headers)

    return handle


RESULT = {
    "tool_use_id": "t",
    "execution_time_ms": 7,
    "result_block": {
        "type": "code_execution_tool_result",
        "tool_use_id": "t",
        "content": {"type": "code_execution_result", "stdout": "2\n", "stderr": "",
                    "return_code": 0, "content": []},
    },
}  # fmt: skip


async def test_each_error_status_is_an_error_of_the_tree_with_its_detail() -> None:
    with pytest.raises(SessionNotFound, match="no session 'x'"):
        await client_of(answer(404, {"detail": "no session 'x'"})).execute("x", PythonCall("1"), 5)
    with pytest.raises(AtCapacity) as full:
        await client_of(answer(503, {"detail": "busy"}, **{"retry-after": "9"})).create()
    assert full.value.retry_after == 9
    with pytest.raises(PayloadTooLarge):
        await client_of(answer(413, {"detail": "too big"})).create()
    with pytest.raises(SandboxError, match="answered 500: boom") as other:
        await client_of(answer(500, {"detail": "boom"})).create()
    assert not isinstance(other.value, ProtocolError)
    with pytest.raises(SandboxError, match="answered 502: <html>"):
        await client_of(answer(502, b"<html>bad gateway</html>")).create()


async def test_a_reply_outside_the_protocol_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="malformed CreateSession"):
        await client_of(answer(201, b"not json")).create()
    with pytest.raises(ProtocolError, match="malformed Execute"):
        await client_of(answer(200, {"result": 1})).execute("s", PythonCall("1"), 5)


async def test_every_request_carries_the_authorization_and_the_call_in_the_contracts_shape() -> (
    None
):
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=RESULT)

    client = client_of(handle, "Bearer tok")
    result = await client.execute("a b/c", PythonCall("1 + 1"), 30)
    assert result.stdout == "2\n" and result.duration_ms == 7
    (request,) = seen
    assert request.headers["authorization"] == "Bearer tok"
    assert request.url.raw_path == b"/sessions/a%20b/c/exec"
    assert json.loads(request.content) == {
        "tool": "code_execution",
        "input": {"code": "1 + 1"},
        "timeout_seconds": 30,
    }


async def test_destroying_a_session_that_is_gone_is_quiet() -> None:
    await client_of(answer(404, {"detail": "no session"})).destroy("gone")


async def test_a_server_that_cannot_be_reached_is_a_transport_failure() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(TransportFailed, match="ConnectError"):
        await client_of(refuse).create()


def sse(*events: tuple[str, Any]) -> bytes:
    return b"".join(f"event: {k}\ndata: {json.dumps(v)}\n\n".encode() for k, v in events)


async def test_a_stream_is_parsed_across_chunk_boundaries_and_ends_with_the_result() -> None:
    body = sse(
        ("stdout", {"text": "a\n"}),
        ("stderr", {"text": "b\n"}),
        ("display", {"data": {"text/plain": "t"}}),
        ("result", RESULT),
        ("stdout", {"text": "never read"}),
    )

    async def in_bytes() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 7):  # split anywhere, even inside a line
            yield body[i : i + 7]

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept"] == "text/event-stream"
        return httpx.Response(200, content=in_bytes())

    events = [e async for e in client_of(handle).stream("s", PythonCall("x"), 5)]
    assert events == [
        Output("stdout", "a\n"),
        Output("stderr", "b\n"),
        Display({"data": {"text/plain": "t"}}),
        Done(ExecResult(stdout="2\n", duration_ms=7)),
    ]


async def test_an_event_on_several_data_lines_is_joined_and_a_bad_one_is_a_protocol_error() -> None:
    split = b'event: stdout\ndata: {"text":\ndata:  "x"}\n\n' + sse(("result", RESULT))
    events = [e async for e in client_of(answer(200, split)).stream("s", PythonCall("x"), 5)]
    assert events[0] == Output("stdout", "x")
    bad = b"event: stdout\ndata: {nope\n\n"
    with pytest.raises(ProtocolError):
        [e async for e in client_of(answer(200, bad)).stream("s", PythonCall("x"), 5)]
    odd = sse(("stdout", {"no": "text"}))
    with pytest.raises(ProtocolError):
        [e async for e in client_of(answer(200, odd)).stream("s", PythonCall("x"), 5)]


async def test_an_upload_is_multipart_with_names_that_cannot_break_out() -> None:
    received: dict[str, Any] = {}

    def handle(request: httpx.Request) -> httpx.Response:
        received["type"] = request.headers["content-type"]
        received["body"] = request.read()
        return httpx.Response(201, json={"path": "d/x.csv", "size_bytes": 3})

    async def chunks() -> AsyncIterator[bytes]:
        yield b"a,"
        yield b"b"

    entry = await client_of(handle).write_file("s", 'd/q"\r\nx.csv', chunks())
    assert (entry.path, entry.size_bytes) == ("d/x.csv", 3)
    boundary = received["type"].split("boundary=")[1]
    body: bytes = received["body"]
    assert body.endswith(f"--{boundary}--\r\n".encode())
    assert b'name="path"\r\n\r\nd/q"\r\nx.csv\r\n' in body  # a value is content, as it is
    assert b'name="file"; filename="q%22%0D%0Ax.csv"' in body  # a header parameter is escaped
    assert b"\r\n\r\na,b\r\n" in body


async def test_a_download_streams_with_its_size_and_name() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.params["path"] == "d/r.csv"
        return httpx.Response(200, content=b"1,2\n", headers={"content-length": "4"})

    download = await client_of(handle).read_file("s", "d/r.csv")
    assert (download.name, download.size) == ("r.csv", 4)
    assert b"".join([c async for c in download.chunks]) == b"1,2\n"


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    with FakeApp(exec_tokens="round-trip-token").serving() as url:
        yield url


async def test_a_round_trip_against_the_app_over_fakes(served: str) -> None:
    client = ExecClient(HttpxTransport(served, 10), "Bearer round-trip-token")
    try:
        info = await client.create()
        result = await client.execute(info.id, PythonCall("print(7)"), 5)
        assert (result.stdout, result.return_code) == ("7\n", 0)

        async def chunks() -> AsyncIterator[bytes]:
            yield b"hello"

        entry = await client.write_file(info.id, "in/a.txt", chunks())
        assert (entry.path, entry.size_bytes) == ("in/a.txt", 5)
        listing, truncated = await client.list_files(info.id, "in")
        assert [e.path for e in listing] == ["in/a.txt"] and truncated is False
        download = await client.read_file(info.id, "in/a.txt")
        assert b"".join([c async for c in download.chunks]) == b"hello"
        events = [e async for e in client.stream(info.id, PythonCall("print(8)"), 5)]
        assert events == [Output("stdout", "8\n"), Done(events[-1].result)]  # type: ignore[union-attr]
        await client.destroy(info.id)
        with pytest.raises(SessionNotFound):
            await client.execute(info.id, PythonCall("1"), 5)
        await client.destroy(info.id)  # again: quiet
    finally:
        with anyio.CancelScope(shield=True):
            await client.transport.close()  # type: ignore[attr-defined]
