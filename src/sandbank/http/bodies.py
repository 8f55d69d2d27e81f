"""Request bodies read with a cap, so no client makes the server hold more than it allows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from ..errors import PayloadTooLarge, SandbankError, Unprocessable, UnsupportedMediaType
from ..streams import gather

MAX_JSON_BODY = 16 * 1024 * 1024


def is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def check_declared(request: Request, cap: int, what: str = "the request body") -> None:
    """`PayloadTooLarge` before reading when the declared Content-Length is over `cap`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise PayloadTooLarge(f"{what} is larger than {cap} bytes")


async def capped(
    chunks: AsyncIterator[bytes], cap: int, what: str = "the request body"
) -> AsyncIterator[bytes]:
    """The chunks of a body, `PayloadTooLarge` once they pass `cap` bytes (whatever was
    declared: a chunked body declares nothing)."""
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > cap:
            raise PayloadTooLarge(f"{what} is larger than {cap} bytes")
        yield chunk


async def read_body(
    request: Request, cap: int, too_large: type[SandbankError] = PayloadTooLarge
) -> bytes:
    """The whole body; `too_large` as soon as it passes `cap` bytes (or says it will)."""

    def refused() -> SandbankError:
        return too_large(f"the request body is larger than {cap} bytes")

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise refused()
    return await gather(request.stream(), cap, refused)


async def json_body(request: Request, optional: bool = False, cap: int = MAX_JSON_BODY) -> Any:
    """The request's JSON body, refusing other media types (a CSRF and confusion guard)."""
    raw = await read_body(request, cap)
    if not raw.strip():
        if optional:
            return None
        raise Unprocessable("a JSON request body is required")
    if not is_json(request.headers.get("content-type")):
        raise UnsupportedMediaType("request bodies must be JSON (Content-Type: application/json)")
    return parse_json(raw)


def parse_json(raw: bytes, invalid: type[SandbankError] = Unprocessable) -> Any:
    """A body as JSON; `invalid`, saying why, when it is not JSON (each API has its status)."""
    try:
        return json.loads(raw)
    except ValueError as e:
        raise invalid(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise invalid("the request body is nested too deeply") from None
