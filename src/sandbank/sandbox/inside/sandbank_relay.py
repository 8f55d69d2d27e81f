"""Inside the sandbox: the relay from 127.0.0.1:PORT to the egress proxy's unix socket.

Standard library only; imports nothing from the server; run as its own process by
`sandbank_egress.start()` with the listening socket's descriptor. The sandbox has no network but
its own loopback, so HTTP clients (pip, requests, httpx, curl) are pointed by the usual proxy
variables at this relay, which passes bytes to the socket Sandbank bound in. The proxy outside
decides what may pass; this relay decides nothing and trusts nothing.
"""

from __future__ import annotations

import asyncio
import socket
import sys

_UNREACHABLE = (
    b"HTTP/1.1 502 Sandbank egress proxy unreachable\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


class Side(asyncio.Protocol):
    """One end of a relayed connection (an asyncio protocol): what it receives, its peer sends.

    Callbacks instead of stream reads: no await per chunk, so the relay costs the sandbox little
    CPU. Flow control passes through (a full peer pauses this side's reading), and so does a
    half-close; when either end is gone, both are closed.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Side | None = None
        self.eof = False
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:  # before the peer is there (Python 3.11 may read despite pause_reading)
            self.early.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if peer is None and isinstance(self, ClientSide):
            return True  # still dialing: the peer gets the EOF once it is there
        if peer is None or peer.transport is None or peer.eof or not peer.transport.can_write_eof():
            return False  # close this end (and, through connection_lost, the peer)
        peer.transport.write_eof()
        return True  # keep this end open: the peer may still answer

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class ClientSide(Side):
    """The end a client (pip, curl) connected to; it dials the proxy's socket for its peer."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.dialing: object = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.pause_reading()  # until the peer is there to receive
        self.dialing = asyncio.get_running_loop().create_task(self.dial())

    async def dial(self) -> None:
        assert self.transport is not None
        try:
            _, up = await asyncio.get_running_loop().create_unix_connection(Side, self.path)
        except OSError:
            self.transport.write(_UNREACHABLE)
            self.transport.close()
            return
        assert up.transport is not None
        if self.transport.is_closing():
            up.transport.close()
            return
        self.peer, up.peer = up, self
        up.transport.writelines(self.early)
        self.early.clear()
        if self.eof:
            up.transport.write_eof()
        self.transport.resume_reading()


async def _serve(fd: int, path: str) -> None:
    listener = socket.socket(fileno=fd)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ClientSide(path), sock=listener)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), sys.argv[2]))
