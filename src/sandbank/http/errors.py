"""Error answers: each contract's own body shape, one shape for the rest, ids for the unexpected.

Under `/api` (the interpreter API's contract): `{message, error_code, error_id}`, `error_code`
the number of the error tree. Everywhere else (the code-execution API, whose contract fixes
`detail` and allows more, and every other route of ours: /metrics, /admin, /fleet, /ui, /docs,
a refused Host): `{detail, code}`, `code` the tree's stable string code.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import BadRequest, MethodNotAllowed, NotFound, SandbankError

log = logging.getLogger("sandbank.http")


def is_interpreter_api(request: Request) -> bool:
    return request.url.path == "/api" or request.url.path.startswith("/api/")


def error_response(
    request: Request, error: SandbankError, headers: dict[str, str] | None = None
) -> Response:
    """The error body each API promises: `{message, error_code, error_id}` under /api,
    `{detail, code}` everywhere else."""
    if is_interpreter_api(request):
        error_id = str(uuid.uuid4())
        log.info("error %s %s %s: %s", error_id, request.method, request.url.path, error.message)
        body: dict[str, object] = {
            "message": error.message,
            "error_code": error.number,
            "error_id": error_id,
        }
    else:
        body = {"detail": error.message, "code": error.code}
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
