"""What both HTTP layers share: error bodies, request ids, the Host allow-list, file headers."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import AtCapacity, SandbankError
from .sandbox.workspace import media_type

log = logging.getLogger("sandbank.http")

# Stable numeric codes for the interpreter API's `error_code` (documented in the README).
ERROR_NUMBERS = {
    "internal": 1000,
    "bad_request": 1001,
    "unknown_tool": 1002,
    "unprocessable": 1003,
    "unsupported_media_type": 1004,
    "is_a_directory": 1005,
    "unauthorized": 1010,
    "forbidden": 1011,
    "path_escape": 1012,
    "not_found": 1020,
    "session_not_found": 1021,
    "conflict": 1030,
    "payload_too_large": 1040,
    "at_capacity": 1050,
    "sandbox_error": 1060,
    "isolation_unavailable": 1061,
    "misdirected": 1070,
    "method_not_allowed": 1080,
    "agent_error": 1100,
    "model_not_configured": 1101,
    "model_endpoint_refused": 1102,
    "model_unavailable": 1103,
    "run_limit_reached": 1104,
    "run_cancelled": 1105,
    "run_in_progress": 1110,
    "too_many_runs": 1111,
    "quota_exceeded": 1112,
}


def is_interpreter_api(request: Request) -> bool:
    return request.url.path == "/api" or request.url.path.startswith("/api/")


def error_response(
    request: Request, status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    """The error body each API promises.

    `{detail}` at the root (code-execution API), `{message, error_code, error_id}` under /api.
    """
    if is_interpreter_api(request):
        error_id = str(uuid.uuid4())
        log.info("error %s %s %s: %s", error_id, request.method, request.url.path, message)
        body: dict[str, object] = {
            "message": message,
            "error_code": ERROR_NUMBERS.get(code, 1000),
            "error_id": error_id,
        }
    else:
        body = {"detail": message}
    return JSONResponse(body, status_code=status, headers=headers)


async def on_sandbank_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SandbankError)
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, AtCapacity) else None
    if exc.status >= 500:
        log.error("%s on %s %s: %s", exc.code, request.method, request.url.path, exc.message)
    return error_response(request, exc.status, exc.code, exc.message, headers)


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
    headers = dict(exc.headers) if exc.headers else None
    return error_response(request, exc.status_code, code, str(exc.detail), headers)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    request_id = uuid.uuid4().hex
    log.exception(
        "unexpected error, request id %s, on %s %s", request_id, request.method, request.url.path
    )
    return error_response(
        request,
        500,
        "internal",
        f"internal error; the server logged it with request id {request_id}",
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
                    request, 421, "misdirected",
                    f"Host {host!r} is not served here; add it to SANDBANK_ALLOWED_HOSTS",
                )  # fmt: skip
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def untrusted_file_headers(filename: str, size: int | None = None) -> dict[str, str]:
    """Bytes written by untrusted code never run as a page on this origin."""
    kind = (
        "inline"
        if media_type(filename).startswith("image/")
        and not filename.lower().endswith((".svg", ".svgz"))
        else "attachment"
    )
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
