"""Response pieces both APIs share: Server-Sent Events, and headers for files code wrote."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

from ..media import media_type

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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
