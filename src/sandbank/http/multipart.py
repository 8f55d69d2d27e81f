"""The one multipart/form-data reader of both APIs: parts streamed as they arrive, bounded.

Routes use it to turn a request into plain values and byte streams for the services: nothing
is held in memory but a field's text, and a malformed body is a `BadRequest`. A form has at
most `max_parts` parts, each with at most `MAX_PART_HEAD` bytes of headers, counted as the
parser meets them (a flood of tiny fields is refused at the first one too many).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from python_multipart.multipart import MultipartParser, parse_options_header

from ..errors import BadRequest, UnsupportedMediaType
from ..streams import gather

MAX_FIELD = 8192
MAX_PARTS = 16  # the largest form either API takes has four (an upload's three signed fields)
MAX_PART_HEAD = 8192  # a part's headers: its name, file name and content type


@dataclass(frozen=True)
class Part:
    """A part's name and, for a file, the file name its sender gave (None if it gave none)."""

    name: str
    filename: str | None


Chunks = AsyncIterator[bytes]


def is_multipart(content_type: str | None) -> bool:
    ctype, params = parse_options_header(content_type)
    return ctype == b"multipart/form-data" and b"boundary" in params


class FormStream:
    """Iterates a form's parts, each with an iterator of its bytes (read it or it is skipped)."""

    def __init__(
        self, content_type: str | None, chunks: Chunks, max_parts: int = MAX_PARTS
    ) -> None:
        ctype, params = parse_options_header(content_type)
        if ctype != b"multipart/form-data" or b"boundary" not in params:
            raise UnsupportedMediaType("the body must be multipart/form-data")
        self._chunks = chunks
        self._max_parts = max_parts
        self._parts = 0
        self._head_bytes = 0
        self._events: deque[tuple[Any, ...]] = deque()
        self._headers: dict[str, bytes] = {}
        self._hname = self._hvalue = b""
        self._finished = False
        self._parser = MultipartParser(
            params[b"boundary"],
            {
                "on_part_begin": self._part_begin,
                "on_header_field": self._header_field,
                "on_header_value": self._header_value,
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": lambda: self._events.append(("end",)),
            },
        )

    # --- the parser's callbacks queue events ------------------------------------------------
    # Raising here stops the parser in the middle of the chunk: nothing more is queued.
    def _part_begin(self) -> None:
        self._headers = {}
        self._head_bytes = 0
        self._parts += 1
        if self._parts > self._max_parts:
            raise BadRequest(f"the form has more than {self._max_parts} parts")

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_PART_HEAD:
            raise BadRequest(f"a form part's headers are larger than {MAX_PART_HEAD} bytes")

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_head(end - start)
        self._hname += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_head(end - start)
        self._hvalue += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._hname.decode("latin-1").lower()] = self._hvalue
        self._hname = self._hvalue = b""

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get("content-disposition"))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        raw = params.get(b"filename")
        filename = raw.decode("utf-8", "replace") if raw is not None else None
        self._events.append(("begin", Part(name, filename)))

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        self._events.append(("data", bytes(data[start:end])))

    # --- pulling ------------------------------------------------------------------------------
    async def _next(self) -> tuple[Any, ...] | None:
        while not self._events:
            if self._finished:
                return None
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                self._finished = True
                self._call(self._parser.finalize)
                continue
            self._call(self._parser.write, chunk)
        return self._events.popleft()

    @staticmethod
    def _call(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except ValueError as e:  # the parser's complaints
            raise BadRequest(f"malformed multipart body: {e}") from None

    async def parts(self) -> AsyncIterator[tuple[Part, Chunks]]:
        while (event := await self._next()) is not None:
            if event[0] != "begin":
                continue  # the rest of a part nobody read
            body = self._body()
            yield event[1], body
            async for _ in body:  # skip what the reader left
                pass

    async def _body(self) -> Chunks:
        while (event := await self._next()) is not None:
            if event[0] == "data":
                yield event[1]
            elif event[0] == "end":
                return
        raise BadRequest("the body ended inside a part")


async def read_field(name: str, chunks: Chunks, limit: int = MAX_FIELD) -> str:
    """A form field's text (at most `limit` bytes)."""

    def refused() -> BadRequest:
        return BadRequest(f"form field {name!r} is longer than {limit} bytes")

    return (await gather(chunks, limit, refused)).decode("utf-8", "replace")
