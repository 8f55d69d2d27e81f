"""The connection edge: what a client may cost the server before a route sees its request.

uvicorn's httptools protocol, bounded:
- request heads: a request line of at most `MAX_LINE` bytes (else 414), header lines of at most
  `MAX_LINE`, `MAX_HEADERS` of them and `MAX_HEAD` bytes in all (else 431), counted before the
  parser sees them (its buffering of one long header costs time quadratic in its length);
- time: a head must arrive within `head_timeout` of the connection or of its first byte
  (else 408, or a silent close if nothing came); between requests uvicorn's keep-alive
  timeout holds;
- connections: at most `max_connections` open at once over every listener, and
  `max_per_client` from one client address; past either, a 503 and the connection closed at
  once, so no client can use up the descriptors the sandboxes need. A full server makes room
  for a newcomer by closing a waiting connection (no request in progress) of the address
  holding the most, so slow connections from a few addresses cannot keep others out;
- bodies: a response sent before its request's body has arrived (a 401, 403, 404 or 413)
  ends the connection; what the client still sends is read and dropped, `LINGER_BYTES` at
  most for `LINGER_SECONDS`, then it closes (closing at once would reset the connection
  before the client read the answer).

And one thing for speed: a response's head leaves with its first body bytes, in one system
call (`HeadWithBody`), not two. On loopback each send wakes the peer: a front or a client
reading a reply woke once for the head and again for the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..errors import (
    HeadersTooLarge,
    RequestTimeout,
    SandbankError,
    TooManyConnections,
    UriTooLong,
)

log = logging.getLogger("sandbank.http")

MAX_LINE = 8 * 1024  # the request line, and each header line
MAX_HEAD = 64 * 1024  # the request line and every header together
MAX_HEADERS = 100
LINGER_BYTES = 1 << 20
LINGER_SECONDS = 2.0
REFUSED_READ = 64 * 1024  # what a refused connection had sent, read so that closing resets nothing


class Waiting(Protocol):
    """A connection that has no request in progress (idle, or its head still coming)."""

    def evict(self) -> None: ...


@dataclass
class ConnectionBook:
    """Open connections over every listener of the process, in all and by client address.

    When the server is full, a new connection takes the place of a waiting one (no request in
    progress: idle, or its head still coming) of the address holding the most, if that
    address holds more than the newcomer's: an address that opens many slow connections
    cannot keep others out, yet no request in progress is ever cut.
    """

    max_connections: int
    max_per_client: int
    head_timeout: float
    open: int = 0
    by_client: Counter[str] = field(default_factory=Counter)
    # Waiting connections by address, oldest first (dicts keep insertion order).
    waiting: dict[str, dict[Waiting, None]] = field(default_factory=dict)
    refused: int = 0  # connections answered 503 at once (metrics)
    evicted: int = 0  # waiting connections closed to make room (metrics)
    heads_refused: int = 0  # requests answered 408, 414 or 431 (metrics)

    def admit(self, client: str) -> str | None:
        """Count a new connection in; or why it is refused."""
        if self.by_client[client] >= self.max_per_client:
            return (
                f"this address holds its most connections ({self.max_per_client}); close "
                "some or retry shortly"
            )
        if self.open >= self.max_connections and not self._make_room(client):
            return f"the server holds its most connections ({self.max_connections}); retry shortly"
        self.open += 1
        self.by_client[client] += 1
        return None

    def _make_room(self, client: str) -> bool:
        mine = self.by_client[client]
        holder = max(self.waiting, key=self.by_client.__getitem__, default=None)
        if holder is None or self.by_client[holder] <= mine + 1:
            return False
        victim = next(iter(self.waiting[holder]))
        self.stop_waiting(holder, victim)
        self.leave(holder)
        self.evicted += 1
        victim.evict()
        return True

    def leave(self, client: str) -> None:
        self.open -= 1
        self.by_client[client] -= 1
        if self.by_client[client] <= 0:
            del self.by_client[client]

    def start_waiting(self, client: str, conn: Waiting) -> None:
        self.waiting.setdefault(client, {})[conn] = None

    def stop_waiting(self, client: str, conn: Waiting) -> None:
        mine = self.waiting.get(client)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.waiting[client]


def protocol_for(book: ConnectionBook) -> type[HttpToolsProtocol]:
    """uvicorn's protocol class for `uvicorn.Config(http=...)`, over one shared book."""

    class Bounded(EdgeProtocol):
        connection_book = book

    return Bounded


class EdgeProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with the bounds of this module (its `connection_book` is set by
    `protocol_for`)."""

    connection_book: ConnectionBook

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counted: str | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingering = -1  # bytes still taken while lingering; -1: not lingering
        self._in_head = True
        self._head_bytes = self._line_bytes = self._lines = 0
        self._first = b""  # the request line's start: which API's error shape to answer in

    # --- connections ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        client = self.client[0] if self.client else ""
        refusal = self.connection_book.admit(client)
        if refusal is not None:
            self.connection_book.refused += 1
            self._refuse_connection(transport, refusal)
            return
        self._counted = client
        self.connection_book.start_waiting(client, self)
        self._arm_head_timer()

    def evict(self) -> None:
        """Closed to make room for another address's connection (the book has let it go)."""
        client, self._counted = self._counted, None
        if client is None or self.transport.is_closing():
            return
        self._cancel_head_timer()
        if self._head_bytes:
            full = TooManyConnections("the server is full: this waiting connection made room")
            self.transport.write(_response(full, None, retry_after=5))
        self.transport.close()

    def _refuse_connection(self, transport: asyncio.Transport, reason: str) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Whatever the client sent already: unread, closing would reset the connection and
            # the client could lose the answer.
            with contextlib.suppress(OSError):
                os.read(sock.fileno(), REFUSED_READ)
        transport.write(_response(TooManyConnections(reason), None, retry_after=5))
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted is not None:
            self.connection_book.stop_waiting(self._counted, self)
            self.connection_book.leave(self._counted)
            self._counted = None
        for timer in (self._head_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    # --- request heads -------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._lingering >= 0:
            self._lingering -= len(data)
            if self._lingering < 0:
                self.transport.close()
            return
        if self._counted is None or self.transport.is_closing():
            return  # refused: nothing is parsed
        if self._in_head:
            error = self._scan_head(data)
            if error is not None:
                self._refuse_request(error)
                return
            if self._in_head:
                self._arm_head_timer()
        super().data_received(data)

    def _scan_head(self, data: bytes) -> SandbankError | None:
        """Count the head's lines and bytes in `data`; the error once a bound is passed.

        The scan stops at the blank line that ends the head: what follows is a body (the
        parser's `on_message_complete` starts the next head's count).
        """
        if len(self._first) < 16:
            self._first += data[: 16 - len(self._first)]
        pos, size = 0, len(data)
        while pos < size:
            newline = data.find(b"\n", pos)
            end = size if newline < 0 else newline
            self._line_bytes += end - pos
            self._head_bytes += end - pos + int(newline >= 0)
            if self._line_bytes > MAX_LINE:
                if self._lines == 0:
                    return UriTooLong(f"the request line is longer than {MAX_LINE} bytes")
                return HeadersTooLarge(f"a header line is longer than {MAX_LINE} bytes")
            if self._head_bytes > MAX_HEAD:
                return HeadersTooLarge(f"the request's headers are larger than {MAX_HEAD} bytes")
            if newline < 0:
                return None
            if self._line_bytes <= 1:  # a blank line ("\r\n")
                if self._lines > 0:
                    self._in_head = False  # the head is whole: the parser has the rest
                    self._cancel_head_timer()
                    return None
            else:
                self._lines += 1
                if self._lines > MAX_HEADERS + 1:
                    return HeadersTooLarge(f"a request may have at most {MAX_HEADERS} headers")
            self._line_bytes = 0
            pos = newline + 1
        return None

    def _refuse_request(self, error: SandbankError) -> None:
        api = b" /api/" in self._first or b" /api " in self._first or b" /api?" in self._first
        self.connection_book.heads_refused += 1
        log.debug("refused a request head: %s", error.message)
        self.transport.write(_response(error, api))
        self._cancel_head_timer()
        self.transport.close()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            timeout = self.connection_book.head_timeout
            self._head_timer = self.loop.call_later(timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if self._head_bytes:
            timeout = self.connection_book.head_timeout
            self._refuse_request(
                RequestTimeout(f"the request's headers did not arrive within {timeout:g} s")
            )
        else:
            self.transport.close()  # an idle connection: nothing to answer

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        if self._counted is not None:
            self.connection_book.stop_waiting(self._counted, self)  # a request in progress
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:  # not upgraded, not refused
            cycle.transport = HeadWithBody(self.transport, cycle, self.loop)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = self._line_bytes = self._lines = 0
        self._first = b""

    # --- early answers -------------------------------------------------------------------
    def on_response_complete(self) -> None:
        cycle, pipelined = self.cycle, bool(self.pipeline)
        if cycle is not None and isinstance(cycle.transport, HeadWithBody):
            cycle.transport.flush()  # a body-less answer (HEAD): its head goes before all else
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if cycle is None or not cycle.more_body:
            if not pipelined and self._counted is not None:
                self.connection_book.start_waiting(self._counted, self)  # idle: keep-alive
            return
        # Answered before the body arrived (refused, most often): the rest is not read.
        self._unset_keepalive_if_required()
        self._lingering = LINGER_BYTES
        try:
            self.transport.write_eof()
        except (OSError, NotImplementedError, RuntimeError):
            self.transport.close()
            return
        self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(LINGER_SECONDS, self.transport.close)


class Cycle(Protocol):
    """What `HeadWithBody` reads of uvicorn's request-response cycle."""

    response_started: bool


class HeadWithBody:
    """The transport as one request's cycle sees it: the response's head is held until its
    first body bytes are written, then both go in one `write`. Held for one turn of the loop
    at most (a streamed response's head is not kept waiting for its first chunk), and written
    before the connection is closed. Nothing else is held: a `100 Continue` (written before
    the response starts) goes at once.
    """

    __slots__ = ("_cycle", "_head", "_loop", "_transport", "_wrote")

    def __init__(
        self, transport: asyncio.Transport, cycle: Cycle, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._transport = transport
        self._cycle = cycle
        self._loop = loop
        self._head: bytes | None = None
        self._wrote = False  # the head has been handed on

    def write(self, data: bytes) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head + data)
        elif not self._wrote and self._cycle.response_started:
            self._head = data
            self._loop.call_soon(self.flush)
            return
        else:
            self._transport.write(data)
        self._wrote = self._wrote or self._cycle.response_started

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._wrote = True
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _response(error: SandbankError, api: bool | None, retry_after: int | None = None) -> bytes:
    """A whole error response in the API's error shape (both, when the API is unknown)."""
    body: dict[str, object] = {}
    if api is not True:
        body["detail"] = error.message
    if api is not False:
        body.update(message=error.message, error_code=error.number, error_id=str(uuid.uuid4()))
    content = json.dumps(body).encode()
    phrase = HTTPStatus(error.status).phrase
    head = [
        f"HTTP/1.1 {error.status} {phrase}",
        "content-type: application/json",
        f"content-length: {len(content)}",
        "connection: close",
    ]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + content
