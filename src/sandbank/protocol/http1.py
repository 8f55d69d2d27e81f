"""A lean HTTP/1.1 keep-alive client, from a front to its nodes (the hot path of every call).

A general client (httpx) costs more per request than the whole warm round trip's budget for the
front; this one speaks only what Sandbank servers answer (Content-Length or chunked bodies).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

IDLE_S = 3.0  # uvicorn closes a keep-alive connection after 5 s idle: never reuse one that old
MAX_IDLE_PER_NODE = 64
LIMIT = 1 << 16  # longest status line plus headers


class TransportFailed(Exception):
    """No answer could be had from the server (connect, reset, EOF, malformed response)."""


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used_at: float = field(default_factory=time.monotonic)

    def fresh(self) -> bool:
        return (
            time.monotonic() - self.used_at < IDLE_S
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        self.writer.close()


@dataclass
class Reply:
    """A server's answer: its status, lower-case headers, and its body whole or as a stream."""

    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None

    def json(self) -> Any:
        return json.loads(self.body)


class Http1Client:
    """Pooled keep-alive connections to one server."""

    def __init__(self, url: str, connect_timeout: float) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.authority = parts.netloc
        self.connect_timeout = connect_timeout
        self.idle: list[Connection] = []

    async def _connect(self) -> Connection:
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port, limit=LIMIT)
        except (OSError, TimeoutError) as e:
            raise TransportFailed(f"connect: {e.__class__.__name__}") from None
        return Connection(reader, writer)

    def _take(self) -> Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if conn.fresh():
                return conn
            conn.close()
        return None

    def _give_back(self, conn: Connection) -> None:
        conn.used_at = time.monotonic()
        if len(self.idle) < MAX_IDLE_PER_NODE:
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()

    async def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | AsyncIterator[bytes] | None,
        stream: bool = False,
    ) -> Reply:
        """One exchange; a pooled connection found closed is retried once on a new one.

        A streamed body cannot be sent twice, so it always gets a new connection.
        """
        conn = None if isinstance(body, AsyncIterator) else self._take()
        if conn is not None:
            try:
                return await self._exchange(conn, method, target, headers, body, stream)
            except TransportFailed:
                pass  # the node closed it meanwhile, before reading the request: resend
        return await self._exchange(await self._connect(), method, target, headers, body, stream)

    async def _exchange(
        self,
        conn: Connection,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | AsyncIterator[bytes] | None,
        stream: bool,
    ) -> Reply:
        head = [f"{method} {target} HTTP/1.1", f"host: {self.authority}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        chunked = False
        if isinstance(body, bytes):
            head.append(f"content-length: {len(body)}")
        elif body is not None and "content-length" not in headers:
            head.append("transfer-encoding: chunked")
            chunked = True
        try:
            raw_head = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
            if isinstance(body, bytes):
                # One write, one system call: on loopback each send costs the peer's wake-up.
                conn.writer.write(raw_head + body)
            else:
                conn.writer.write(raw_head)
            if body is not None and not isinstance(body, bytes):
                async for chunk in body:
                    if chunk:
                        conn.writer.write(
                            b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk
                        )
                        await conn.writer.drain()
                if chunked:
                    conn.writer.write(b"0\r\n\r\n")
            await conn.writer.drain()
            status, rheaders = await self._read_head(conn.reader)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            conn.close()
            raise TransportFailed(e.__class__.__name__) from None
        except BaseException:
            conn.close()
            raise
        reusable = rheaders.get("connection", "").lower() != "close"
        if status in (204, 304) or status < 200 or method == "HEAD":
            rheaders["content-length"] = "0"  # no body follows, whatever the headers say
        body_iter = self._body(conn, rheaders, reusable)
        if stream:
            return Reply(status, rheaders, stream=body_iter)
        parts = []
        try:
            async for part in body_iter:
                parts.append(part)
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            raise TransportFailed(e.__class__.__name__) from None
        return Reply(status, rheaders, body=b"".join(parts))

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return status, headers

    async def _body(
        self, conn: Connection, headers: dict[str, str], reusable: bool
    ) -> AsyncIterator[bytes]:
        reader = conn.reader
        complete = False
        try:
            if headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")
                        break
                    yield await reader.readexactly(size)
                    await reader.readexactly(2)
            elif "content-length" in headers:
                left = int(headers["content-length"])
                while left > 0:
                    chunk = await reader.read(min(left, 256 * 1024))
                    if not chunk:
                        raise asyncio.IncompleteReadError(b"", left)
                    left -= len(chunk)
                    yield chunk
            else:
                reusable = False
                while chunk := await reader.read(256 * 1024):
                    yield chunk
            complete = True
        finally:
            if complete and reusable:
                self._give_back(conn)
            else:
                with contextlib.suppress(Exception):
                    conn.close()
