"""What both HTTP layers share: error bodies, request ids, the Host allow-list, file headers."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import (
    BadRequest,
    MethodNotAllowed,
    Misdirected,
    NotFound,
    SandbankError,
)
from .sandbox.workspace import media_type

Endpoint = Callable[[Request], Awaitable[Response]]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

log = logging.getLogger("sandbank.http")


def is_interpreter_api(request: Request) -> bool:
    return request.url.path == "/api" or request.url.path.startswith("/api/")


def error_response(
    request: Request, error: SandbankError, headers: dict[str, str] | None = None
) -> Response:
    """The error body each API promises.

    `{detail}` at the root (code-execution API), `{message, error_code, error_id}` under /api.
    """
    if is_interpreter_api(request):
        error_id = str(uuid.uuid4())
        log.info("error %s %s %s: %s", error_id, request.method, request.url.path, error.message)
        body: dict[str, object] = {
            "message": error.message,
            "error_code": error.number,
            "error_id": error_id,
        }
    else:
        body = {"detail": error.message}
    return JSONResponse(body, status_code=error.status, headers=headers)


async def on_sandbank_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SandbankError)
    retry = getattr(exc, "retry_after", None)  # AtCapacity, SandboxUnavailable
    headers = {"Retry-After": str(retry)} if retry is not None else None
    if exc.status >= 500:
        log.error("%s on %s %s: %s", exc.code, request.method, request.url.path, exc.message)
    return error_response(request, exc, headers)


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = {404: NotFound, 405: MethodNotAllowed}.get(exc.status_code, BadRequest)
    error = kind(str(exc.detail))
    error.status = exc.status_code
    headers = dict(exc.headers) if exc.headers else None
    return error_response(request, error, headers)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    request_id = uuid.uuid4().hex
    log.exception(
        "unexpected error, request id %s, on %s %s", request_id, request.method, request.url.path
    )
    return error_response(
        request, SandbankError(f"internal error; the server logged it with request id {request_id}")
    )


EXCEPTION_HANDLERS: dict[
    type[Exception] | int, Callable[[Request, Exception], Awaitable[Response]]
] = {
    SandbankError: on_sandbank_error,
    HTTPException: on_http_error,
    Exception: on_unexpected,
}


class HostAllowList:
    """Refuses requests whose Host is not ours, so DNS rebinding cannot reach a local server."""

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.allowed = {h.strip().lower() for h in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.any:
            host = ""
            for key, value in scope["headers"]:
                if key == b"host":
                    host = value.decode("latin-1").lower()
            name = host if host.endswith("]") else host.rsplit(":", 1)[0]
            if host not in self.allowed and name not in self.allowed:
                request = Request(scope)
                response = error_response(
                    request,
                    Misdirected(
                        f"Host {host!r} is not served here; add it to SANDBANK_ALLOWED_HOSTS"
                    ),
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# Server-Sent Events: never cached, never buffered by a proxy (nginx reads the second).
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def sse(event: str, data: Any, event_id: str | None = None) -> bytes:
    """One Server-Sent Event; `event_id` becomes the client's `Last-Event-ID` on reconnect."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def untrusted_file_headers(filename: str, size: int | None = None) -> dict[str, str]:
    """Bytes written by untrusted code never run as a page on this origin."""
    kind = (
        "inline"
        if media_type(filename).startswith("image/")
        and not filename.lower().endswith((".svg", ".svgz"))
        else "attachment"
    )
    # Control characters (a newline in a name) would break the header: they never reach it.
    filename = _CONTROL.sub("_", filename)
    ascii_name = filename.encode("ascii", "replace").decode().replace('"', "_").replace("\\", "_")
    headers = {
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'",
        "Content-Disposition": (
            f"{kind}; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename)}"
        ),
        "Cache-Control": "private, no-store",
    }
    if size is not None:
        headers["Content-Length"] = str(size)
    return headers


def grouped_routes(table: list[tuple[str, str, Endpoint]]) -> list[Route]:
    """One route per path serving all its methods: a 405 (or OPTIONS) names every one of them."""
    by_path: dict[str, dict[str, Endpoint]] = {}
    for path, method, endpoint in table:
        by_path.setdefault(path, {})[method] = endpoint
    return [Route(path, _dispatch(methods), methods=[*methods, "OPTIONS"])
            for path, methods in by_path.items()]  # fmt: skip


def _dispatch(methods: dict[str, Endpoint]) -> Endpoint:
    allow = ", ".join(sorted({*methods, "OPTIONS", *(["HEAD"] if "GET" in methods else [])}))

    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        if method == "OPTIONS":
            return Response(status_code=204, headers={"Allow": allow})
        return await methods[method](request)

    return endpoint
