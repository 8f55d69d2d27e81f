"""PutFile's body: multipart streamed into the workspace, capped, never held in memory."""

from __future__ import annotations

import errno
import os
import re
import unicodedata
from typing import Any

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from ..errors import BadRequest, PayloadTooLarge, Unprocessable, UnsupportedMediaType
from ..sandbox.workspace import Workspace

MAX_FIELD = 4096
_UNSAFE = re.compile(r"[^\w.\- ()+,=@]", re.UNICODE)


def sanitize_name(raw: str) -> str:
    """A plain file name from an uploaded name: no directories, controls or leading dots."""
    name = unicodedata.normalize("NFC", raw.replace("\\", "/").rsplit("/", 1)[-1])
    name = _UNSAFE.sub("_", name).strip(" .")
    return name[:200] or "upload"


class _Receiver:
    """Collects the form's fields and writes its `file` part to a staged file, counting bytes."""

    def __init__(self, ws: Workspace, cap: int) -> None:
        self.ws = ws
        self.cap = cap
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.staged: str | None = None
        self.fd = -1
        self.size = 0
        self._headers: dict[str, bytes] = {}
        self._hname = b""
        self._hvalue = b""
        self._part: str | None = None
        self._is_file = False
        self._value = bytearray()

    def callbacks(self) -> Any:
        return {
            "on_part_begin": self.part_begin,
            "on_header_field": lambda d, s, e: setattr(self, "_hname", self._hname + d[s:e]),
            "on_header_value": lambda d, s, e: setattr(self, "_hvalue", self._hvalue + d[s:e]),
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
        }

    def part_begin(self) -> None:
        self._headers = {}
        self._part = None
        self._value = bytearray()

    def header_end(self) -> None:
        self._headers[self._hname.decode("latin-1").lower()] = self._hvalue
        self._hname = self._hvalue = b""

    def headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get("content-disposition"))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        self._part = name
        self._is_file = name == "file"
        if self._is_file:
            if self.staged is not None:
                raise BadRequest("only one file part is accepted")
            self.filename = params.get(b"filename", b"").decode("utf-8", "replace") or None
            self.staged, self.fd = self.ws.stage()

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self._is_file:
            self.size += end - start
            if self.size > self.cap:
                raise PayloadTooLarge(f"the file is larger than the cap of {self.cap} bytes")
            try:
                os.write(self.fd, data[start:end])
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise PayloadTooLarge("the session's workspace disk is full") from None
                raise
        else:
            self._value += data[start:end]
            if len(self._value) > MAX_FIELD:
                raise BadRequest(f"form field {self._part!r} is too long")

    def part_end(self) -> None:
        if self._is_file:
            os.close(self.fd)
            self.fd = -1
        elif self._part:
            self.fields[self._part] = self._value.decode("utf-8", "replace")

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.staged is not None:
            self.ws.discard(self.staged)
            self.staged = None


async def receive_upload(request: Request, ws: Workspace, cap: int) -> tuple[str, int]:
    ctype, params = parse_options_header(request.headers.get("content-type"))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise UnsupportedMediaType("PutFile takes multipart/form-data with a `file` part")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap + 64 * 1024:
        raise PayloadTooLarge(f"the file is larger than the cap of {cap} bytes")
    rx = _Receiver(ws, cap)
    parser = MultipartParser(params[b"boundary"], rx.callbacks())
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
        if rx.staged is None:
            raise Unprocessable("the form has no `file` part")
        path = rx.fields.get("path") or sanitize_name(rx.filename or "")
        final = ws.commit(rx.staged, path)
        rx.staged = None
        return final, rx.size
    except Exception as e:
        rx.abort()
        if isinstance(e, ValueError) and not isinstance(e, BadRequest):
            raise BadRequest(f"malformed multipart body: {e}") from None
        raise
