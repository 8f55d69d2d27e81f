"""The Connect protocol, as far as E2B's SDKs speak it: JSON messages, unary and streaming calls.

Our own small adapter, not connectrpc's server: the SDKs use a fixed subset (JSON codec only,
no compression, HTTP/1.1: unary calls, server streams, one client stream), the SDK we test
with pins connectrpc and protobuf-py to versions of its own, and what matters (a process
outlives its stream, deadlines, keepalives) lives in the handlers anyway. Messages are plain
dicts in the proto3 JSON mapping (`messages.py`).

- unary: `application/json` in and out; an error is its HTTP status with
  `{"code": "<connect code>", "message"}`.
- server streaming: one enveloped request (`application/connect+json`), then HTTP 200 and a
  sequence of envelopes (1 flag byte, 4-byte length, JSON), ended by an end-stream envelope
  (flag 2) with `{}` or `{"error": {...}}`: a stream's error never changes its status.
- client streaming: several enveloped requests (read whole: HTTP/1.1 is half-duplex here),
  one message and the end-stream back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import (
    AlreadyExists,
    AtCapacity,
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    SandbankError,
    SandboxUnavailable,
    SessionNotFound,
    Unauthorized,
)
from ..streams import gather

Message = dict[str, Any]
Unary = Callable[[Message, "Call"], Awaitable[Message]]
Streaming = Callable[[Message, "Call"], AsyncIterator[Message]]
ClientStreaming = Callable[[list[Message], "Call"], Awaitable[Message]]

HTTP_OF = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
    "not_found": 404, "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429,
    "failed_precondition": 400, "aborted": 409, "out_of_range": 400, "unimplemented": 501,
    "internal": 500, "unavailable": 503, "data_loss": 500, "unauthenticated": 401,
}  # fmt: skip
END_STREAM = 0x02
COMPRESSED = 0x01
ENVELOPE = struct.Struct(">BI")
MAX_REQUEST = 16 * 1024 * 1024
KEEPALIVE_DEFAULT = 90.0
_STREAM = "application/connect+json"


class ConnectError(Exception):
    """An error in Connect's terms."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def connect_error(e: BaseException) -> ConnectError:
    """One of our errors (or a deadline) in Connect's terms."""
    if isinstance(e, ConnectError):
        return e
    if isinstance(e, TimeoutError):
        return ConnectError("deadline_exceeded", "the deadline was exceeded")
    if not isinstance(e, SandbankError):
        return ConnectError("internal", "an unexpected error; the server logged it")
    for kind, code in (
        (AlreadyExists, "already_exists"),
        (SessionNotFound, "unavailable"),
        (NotFound, "not_found"),
        (Unauthorized, "unauthenticated"),
        (Forbidden, "permission_denied"),
        (Conflict, "failed_precondition"),
        (BadRequest, "invalid_argument"),
        (PayloadTooLarge, "resource_exhausted"),
        (AtCapacity, "resource_exhausted"),
        (SandboxUnavailable, "unavailable"),
    ):
        if isinstance(e, kind):
            return ConnectError(code, e.message)
    return ConnectError("internal", e.message)


def error_response(e: ConnectError) -> Response:
    return JSONResponse({"code": e.code, "message": e.message}, HTTP_OF.get(e.code, 500))


class Call:
    """What a handler may want of its request beyond the message: deadline, keepalive."""

    def __init__(self, request: Request) -> None:
        self.request = request
        raw = request.headers.get("connect-timeout-ms", "")
        self.timeout = int(raw) / 1000 if raw.isdigit() and int(raw) > 0 else None
        now = asyncio.get_running_loop().time()
        self.deadline = None if self.timeout is None else now + self.timeout  # the loop's clock
        ping = request.headers.get("keepalive-ping-interval", "")
        self.keepalive = float(ping) if ping.isdigit() and int(ping) > 0 else KEEPALIVE_DEFAULT


def envelope(flags: int, message: Message) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return ENVELOPE.pack(flags, len(payload)) + payload


def end_stream(error: ConnectError | None = None) -> bytes:
    body: Message = {}
    if error is not None:
        body["error"] = {"code": error.code, "message": error.message}
    return envelope(END_STREAM, body)


def _decode(data: bytes) -> Message:
    try:
        message = json.loads(data or b"{}")
    except (ValueError, RecursionError):
        raise ConnectError("invalid_argument", "the message is not JSON") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "the message is not a JSON object")
    return message


def _envelopes(body: bytes) -> list[Message]:
    messages = []
    at = 0
    while at < len(body):
        if len(body) - at < ENVELOPE.size:
            raise ConnectError("invalid_argument", "a truncated envelope")
        flags, size = ENVELOPE.unpack_from(body, at)
        at += ENVELOPE.size
        if size > len(body) - at:
            raise ConnectError("invalid_argument", "a truncated envelope")
        if flags & COMPRESSED:
            raise ConnectError("unimplemented", "compressed messages are not supported")
        if not flags & END_STREAM:
            messages.append(_decode(body[at : at + size]))
        at += size
    return messages


async def _body(request: Request) -> bytes:
    def refused() -> ConnectError:
        return ConnectError("resource_exhausted", f"the request is larger than {MAX_REQUEST}")

    return await gather(request.stream(), MAX_REQUEST, refused)


def _refused(request: Request, media: str) -> Response | None:
    """415 naming `media` when the request's body is not of it."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() == media:
        return None
    return Response(status_code=415, headers={"Accept-Post": media})


async def unary(request: Request, handler: Unary) -> Response:
    if (refused := _refused(request, "application/json")) is not None:
        return refused
    call = Call(request)
    try:
        message = _decode(await _body(request))
        async with asyncio.timeout(call.timeout):
            answer = await handler(message, call)
    except (ConnectError, SandbankError, TimeoutError) as e:
        return error_response(connect_error(e))
    return JSONResponse(answer)


async def server_stream(request: Request, handler: Streaming) -> Response:
    if (refused := _refused(request, _STREAM)) is not None:
        return refused
    call = Call(request)
    # Read whole before answering: a streaming response's disconnect watch takes the
    # request's messages, and a body read later would be lost.
    try:
        messages = _envelopes(await _body(request))
        if len(messages) != 1:
            raise ConnectError("invalid_argument", "a server stream takes exactly one message")
        stream = handler(messages[0], call)
        first = await _first(stream, call.deadline)
    except (ConnectError, SandbankError, TimeoutError) as e:
        return StreamingResponse(_once(end_stream(connect_error(e))), media_type=_STREAM)
    return StreamingResponse(_rest(first, stream, call.deadline), media_type=_STREAM)


async def _first(stream: AsyncIterator[Message], deadline: float | None) -> Message | None:
    """The stream's first message, so that a failing call fails before its answer starts."""
    async with asyncio.timeout_at(deadline):
        return await anext(stream, None)


async def _rest(
    first: Message | None, stream: AsyncIterator[Message], deadline: float | None
) -> AsyncIterator[bytes]:
    try:
        if first is not None:
            yield envelope(0, first)
            async with asyncio.timeout_at(deadline):
                async for message in stream:
                    yield envelope(0, message)
        yield end_stream()
    except (ConnectError, SandbankError, TimeoutError) as e:
        yield end_stream(connect_error(e))
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()  # type: ignore[attr-defined]


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def client_stream(request: Request, handler: ClientStreaming) -> Response:
    if (refused := _refused(request, _STREAM)) is not None:
        return refused
    call = Call(request)
    try:
        messages = _envelopes(await _body(request))
        async with asyncio.timeout(call.timeout):
            answer = await handler(messages, call)
        data = envelope(0, answer) + end_stream()
    except (ConnectError, SandbankError, TimeoutError) as e:
        data = end_stream(connect_error(e))
    return Response(data, media_type=_STREAM)


async def with_keepalive(
    stream: AsyncIterator[Message], interval: float, keepalive: Message
) -> AsyncIterator[Message]:
    """The stream's messages, and `keepalive` after each `interval` of silence (so proxies
    keep an idle stream open)."""
    pending: asyncio.Task[Message] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield keepalive
                continue
            try:
                message = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield message
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
