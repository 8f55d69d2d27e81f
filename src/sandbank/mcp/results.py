"""A call's result as MCP content: its text, its images, links to the files it produced.

One text block first (stdout, then stderr, the return code when not 0, the produced files), the
text forms of displayed tables, then each image once (display bundles' PNGs and JPEGs, produced
PNG and JPEG files), then a resource link per produced file.
"""

from __future__ import annotations

import base64
from urllib.parse import quote, unquote

import mcp_types as types

from ..media import media_type
from ..protocol.calls import RC_TIMEOUT, ExecResult

SCHEME = "sandbank"
URI_TEMPLATE = "sandbank://sessions/{session_id}/files/{+path}"
IMAGE_TYPES = ("image/png", "image/jpeg")
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # larger pictures are links only
MAX_IMAGES = 10  # per result; the rest are links
# What a table's displayed text is taken from, best first (HTML is for browsers, not models).
TABLE_TYPES = ("text/markdown", "text/plain")


def file_uri(session_id: str, path: str) -> str:
    return f"{SCHEME}://sessions/{quote(session_id, safe='')}/files/{quote(path)}"


def parse_uri(uri: str) -> tuple[str, str] | None:
    """(session id, workspace path) of a file's URI; None for any other URI."""
    prefix = f"{SCHEME}://sessions/"
    if not uri.startswith(prefix):
        return None
    session_id, sep, path = uri.removeprefix(prefix).partition("/files/")
    if not sep or not session_id or not path:
        return None
    return unquote(session_id), unquote(path)


def is_image(path: str) -> bool:
    return media_type(path) in IMAGE_TYPES


def text_of(result: ExecResult, timeout: float) -> str:
    """What a model reads of a call: its output, and what went wrong when something did."""
    parts: list[str] = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.return_code == RC_TIMEOUT:
        parts.append(
            f"[timed out after {timeout:g} s (its timeout_seconds): the call was interrupted "
            f"(return code {RC_TIMEOUT}); the session's state survives unless stderr says "
            "otherwise]"
        )
    elif result.return_code != 0:
        parts.append(f"[return code {result.return_code}]")
    if result.files:
        parts.append("[files] " + ", ".join(result.files))
    return "\n".join(parts) if parts else "(no output)"


def call_result(
    session_id: str,
    result: ExecResult,
    timeout: float,
    pictures: dict[str, bytes],
) -> types.CallToolResult:
    """The MCP result of a call; `pictures` are the produced image files that were read."""
    content: list[types.ContentBlock] = [types.TextContent(text=text_of(result, timeout))]
    images: list[tuple[str, str]] = []  # (media type, base64)
    for bundle in result.displays:
        data = bundle.get("data", {})
        image = next((t for t in IMAGE_TYPES if t in data), None)
        if image is not None:
            images.append((image, data[image]))
            continue
        table = next((data[t] for t in TABLE_TYPES if t in data), None)
        # An echoed value's text is on stdout already.
        if table and table.strip() not in result.stdout:
            content.append(types.TextContent(text=table))
    for path, data in pictures.items():
        images.append((media_type(path), base64.b64encode(data).decode()))
    seen: set[str] = set()
    for mime, data in images:
        if data not in seen and len(seen) < MAX_IMAGES:
            seen.add(data)
            content.append(types.ImageContent(data=data, mime_type=mime))
    for path in result.files:
        content.append(
            types.ResourceLink(
                name=path, uri=file_uri(session_id, path), mime_type=media_type(path)
            )
        )
    return types.CallToolResult(content=content, is_error=result.return_code != 0)


def error_result(message: str) -> types.CallToolResult:
    """A failure the model can act on (a bad argument, an unknown handle, a missing file)."""
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def file_contents(
    uri: str, path: str, data: bytes
) -> types.TextResourceContents | types.BlobResourceContents:
    """A file as a resource's contents: text when it is UTF-8 text (no NUL), base64 otherwise."""
    mime = media_type(path)
    if not mime.startswith("image/") and b"\0" not in data:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            if mime == "application/octet-stream":
                mime = "text/plain"
            return types.TextResourceContents(uri=uri, mime_type=mime, text=text)
    return types.BlobResourceContents(uri=uri, mime_type=mime, blob=base64.b64encode(data).decode())
