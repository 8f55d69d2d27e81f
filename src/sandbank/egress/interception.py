"""Requests the proxy reads to add a credential: terminated TLS, HTTP/1.1 both ways (h11).

Only a CONNECT to a destination that has a credential, once the policy allowed it, comes here;
every other CONNECT stays a tunnel of bytes. The proxy has already opened its own TLS connection
to the checked address, verifying the destination's real certificate; the sandbox's handshake
is completed with a leaf of the deployment CA (`authority.py`). Then, request by request on the
kept-alive connection:

- the request must be for the destination: its Host (and an absolute target's authority) name
  the CONNECT's name, or it is refused (421) and nothing is sent: a credential never goes to a
  name other than its own over a shared address;
- the credential in force at that moment is looked up again (one deleted meanwhile is not
  added) and added: its headers replace any the sandbox sent under the same names, its query
  parameter replaces a same-named one; never merged;
- the answer is relayed as it comes, with any header whose value holds a credential's value
  cut out (a `Location` echoing a query credential, say). Bodies are relayed as they are: an
  upstream that echoes its request back shows the credential (README).

Redirects are the client's: a `Location` to another name is a new request on a new CONNECT,
which gets a credential only if that name has one of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote, unquote_plus

import h11

from .credentials import Applicable, Credential
from .policy import normalize_name

HEAD_LIMIT = 32 * 1024
CHUNK = 256 * 1024
REMOVED = b"[removed by sandbank: it held a credential]"
# Framing headers are never rewritten (they hold no secret, and the answer depends on them).
UNTOUCHED = frozenset({b"content-length", b"transfer-encoding", b"connection"})

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Closed(Exception):
    """The connection is over (a side went away, or a limit ended it)."""


@dataclass
class Link:
    """What a terminated connection needs of its proxy and its session."""

    host: str  # the CONNECT's name (checked by the policy)
    port: int
    credentials: Applicable  # looked up on each request
    connect: Callable[[], Awaitable[Streams]]  # a new verified TLS connection upstream
    moved: Callable[[int, bool], Awaitable[None]]  # count bytes (True: out), limits, rate
    injected: Callable[[Credential], None]  # a request went out with this credential
    idle: float  # seconds without traffic before the connection is closed


def with_query(target: bytes, name: str, value: str) -> bytes:
    """`target` with the parameter `name` set to `value`, replacing any of the same name."""
    path, _, query = target.partition(b"?")
    kept = [
        part
        for part in query.split(b"&")
        if part and unquote_plus(part.split(b"=", 1)[0].decode("latin-1")) != name
    ]
    kept.append(f"{quote(name, safe='')}={quote(value, safe='')}".encode("ascii"))
    return path + b"?" + b"&".join(kept)


def add_credential(
    headers: list[tuple[bytes, bytes]], target: bytes, credential: Credential
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and target with the credential in: same names replaced, never merged."""
    secret = credential.secret
    replaced = {name.lower().encode() for name, _ in secret.headers}
    out = [(n, v) for n, v in headers if n.lower() not in replaced]
    out += [(n.encode("ascii"), v.encode("ascii")) for n, v in secret.headers]
    if secret.query is not None and target != b"*":
        target = with_query(target, *secret.query)
    return out, target


def scrub(headers: list[tuple[bytes, bytes]], markers: list[bytes]) -> list[tuple[bytes, bytes]]:
    """Headers with every value that holds a marker (a credential's value) cut out."""
    if not markers:
        return headers
    return [
        (n, REMOVED if n.lower() not in UNTOUCHED and any(m in v for m in markers) else v)
        for n, v in headers
    ]


def scrub_head(head: bytes, markers: list[bytes]) -> bytes:
    """A raw response head (status line, headers, blank line) with `scrub` applied."""
    if not markers or not any(m in head for m in markers):
        return head
    lines = head.split(b"\r\n")
    out = [lines[0]]
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.lower().strip() not in UNTOUCHED and any(m in value for m in markers):
            line = name + b": " + REMOVED
        out.append(line)
    return b"\r\n".join(out)


def misdirected(request: h11.Request, host: str) -> str | None:
    """Why a request on a connection to `host` is not for `host` (None: it is)."""
    if request.method == b"CONNECT":
        return "a CONNECT inside a tunnel is not relayed"
    hosts = [v for n, v in request.headers if n == b"host"]
    if len(hosts) != 1 or _name_of(hosts[0]) != host:
        return f"this connection is to {host}: a request for another host does not go through it"
    target = request.target
    if target.startswith(b"/") or target == b"*":
        return None
    scheme, sep, rest = target.partition(b"://")
    if sep and scheme.lower() in (b"https", b"http"):
        authority = rest.split(b"/", 1)[0].split(b"?", 1)[0]
        if b"@" not in authority and _name_of(authority) == host:
            return None
    return f"this connection is to {host}: the request's target names another"


def _name_of(authority: bytes) -> str | None:
    text = authority.decode("latin-1").strip()
    if text.startswith("["):
        return None  # an address: never a credential's name
    return normalize_name(text.rsplit(":", 1)[0] if ":" in text else text)


class Terminated:
    """One terminated connection from a sandbox: its requests, each with the credential added."""

    def __init__(self, link: Link, client: Streams, upstream: Streams) -> None:
        self.link = link
        self.reader, self.writer = client
        self.upstream: Streams | None = upstream
        self.client = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
        self.up = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_LIMIT)

    async def run(self) -> None:
        try:
            while await self._exchange():
                pass
        except (Closed, OSError, TimeoutError, h11.LocalProtocolError):
            pass
        except h11.RemoteProtocolError as e:
            await self._refuse(400, f"malformed request: {e}"[:200])
        finally:
            self._drop_upstream()

    # --- one request and its answer --------------------------------------------------------
    async def _exchange(self) -> bool:
        """Relay one request and its answer; True when the connection may take another."""
        event = await self._next(self.client, self.reader, upstream=False)
        if not isinstance(event, h11.Request):
            return False
        why = misdirected(event, self.link.host)
        if why is not None:
            await self._refuse(421, why)
            return False
        headers, target = list(event.headers.raw_items()), event.target
        credential = self.link.credentials.find(self.link.host, self.link.port)
        if credential is not None:
            headers, target = add_credential(headers, target, credential)
        if self.upstream is None or self.upstream[0].at_eof():
            self._drop_upstream()
            try:
                self.upstream = await self.link.connect()
            except OSError:
                await self._refuse(502, f"could not connect to {self.link.host}:{self.link.port}")
                return False
            self.up = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_LIMIT)
        request = h11.Request(method=event.method, target=target, headers=headers)
        await self._up(self.up.send(request))
        if credential is not None:
            self.link.injected(credential)
        markers = credential.secret.markers() if credential is not None else []
        body = asyncio.create_task(self._request_body())
        try:
            switched = await self._answer(markers)
            if switched:
                await body
                await self._switched()
                return False
            if not body.done():
                return False  # answered before the body was sent: the connection cannot go on
            await body
        finally:
            if not body.done():
                body.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await body
        if h11.MUST_CLOSE in (self.client.our_state, self.client.their_state):
            return False
        self.client.start_next_cycle()
        if self.up.our_state is h11.DONE and self.up.their_state is h11.DONE:
            self.up.start_next_cycle()
        else:
            self._drop_upstream()
        return True

    async def _request_body(self) -> None:
        while True:
            event = await self._next(self.client, self.reader, upstream=False)
            if isinstance(event, h11.Data):
                await self._up(self.up.send(h11.Data(data=event.data)))
            elif isinstance(event, h11.EndOfMessage):
                await self._up(self.up.send(h11.EndOfMessage(headers=event.headers)))
                return
            else:  # the sandbox went away mid-body
                raise Closed()

    async def _answer(self, markers: list[bytes]) -> bool:
        """Relay the answer, `markers` cut from its headers; True when the protocol switched."""
        assert self.upstream is not None
        up_reader = self.upstream[0]
        started = False
        while True:
            try:
                event = await self._next(self.up, up_reader, upstream=True)
            except (Closed, h11.RemoteProtocolError) as e:
                if not started:
                    reason = "the destination sent a malformed answer"
                    if isinstance(e, Closed):
                        reason = "the destination closed the connection"
                    await self._refuse(502, reason)
                raise Closed() from None
            if isinstance(event, h11.InformationalResponse):
                headers = scrub(list(event.headers.raw_items()), markers)
                await self._down(
                    self.client.send(
                        h11.InformationalResponse(
                            status_code=event.status_code, headers=headers, reason=event.reason
                        )
                    )
                )
                if event.status_code == 101:
                    return True
            elif isinstance(event, h11.Response):
                started = True
                headers = scrub(list(event.headers.raw_items()), markers)
                response = h11.Response(
                    status_code=event.status_code, headers=headers, reason=event.reason
                )
                await self._down(self.client.send(response))
            elif isinstance(event, h11.Data):
                await self._down(self.client.send(h11.Data(data=event.data)))
            elif isinstance(event, h11.EndOfMessage):
                trailers = scrub(list(event.headers.raw_items()), markers)
                await self._down(self.client.send(h11.EndOfMessage(headers=trailers)))
                return False
            else:
                raise Closed()

    async def _switched(self) -> None:
        """After a 101 (a WebSocket): bytes both ways, as a tunnel."""
        assert self.upstream is not None
        up_reader = self.upstream[0]
        leftover_up, _ = self.client.trailing_data
        leftover_down, _ = self.up.trailing_data
        if leftover_up:
            await self._up(leftover_up)
        if leftover_down:
            await self._down(leftover_down)

        async def pump(src: asyncio.StreamReader, to_upstream: bool) -> None:
            while data := await self._read(src, upstream=not to_upstream):
                await (self._up(data) if to_upstream else self._down(data))

        tasks = [asyncio.create_task(pump(self.reader, True)),
                 asyncio.create_task(pump(up_reader, False))]  # fmt: skip
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- bytes ---------------------------------------------------------------------------
    async def _next(
        self, conn: h11.Connection, reader: asyncio.StreamReader, *, upstream: bool
    ) -> object:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self._read(reader, upstream=upstream))
                continue
            if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                raise Closed()
            return event

    async def _read(self, reader: asyncio.StreamReader, *, upstream: bool) -> bytes:
        """A chunk (b"" at the end); what comes from upstream is counted in."""
        async with asyncio.timeout(self.link.idle):
            data = await reader.read(CHUNK)
        if data and upstream:
            await self.link.moved(len(data), False)
        return data

    async def _up(self, data: bytes | None) -> None:
        if not data:
            return
        assert self.upstream is not None
        await self.link.moved(len(data), True)
        self.upstream[1].write(data)
        await self.upstream[1].drain()

    async def _down(self, data: bytes | None) -> None:
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def _refuse(self, status: int, reason: str) -> None:
        """Answer the sandbox ourselves, if an answer can still be sent; then close."""
        body = f"{reason}\n".encode()
        response = h11.Response(
            status_code=status,
            headers=[
                (b"content-type", b"text/plain"),
                (b"content-length", str(len(body)).encode()),
                (b"x-sandbank-egress", b"refused"),
                (b"connection", b"close"),
            ],
            reason=reason.encode("ascii", "replace")[:200],
        )
        with contextlib.suppress(h11.LocalProtocolError, OSError):
            data = self.client.send(response)
            data = (data or b"") + (self.client.send(h11.Data(data=body)) or b"")
            data += self.client.send(h11.EndOfMessage()) or b""
            self.writer.write(data)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.writer.drain(), 5.0)

    def _drop_upstream(self) -> None:
        """Done with the upstream: its socket is closed now. (A TLS close would first wait for
        the upstream's close_notify, up to 30 s, and a server that never sends it would hold
        the socket until the garbage collector found it.) Nothing is left to send it."""
        if self.upstream is not None:
            self.upstream[1].transport.abort()
            self.upstream = None
