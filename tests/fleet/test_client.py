"""The front's HTTP/1.1 client to nodes, against a loopback server that misbehaves on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sandbank.protocol.http1 import Http1Client as NodeClient
from sandbank.protocol.http1 import TransportFailed


async def serve(handler: object) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.decode().split("\r\n"):
        if line.lower().startswith("content-length:"):
            length = int(line.split(":")[1])
    return await reader.readexactly(length)


async def finish(client: NodeClient, server: asyncio.Server) -> None:
    client.close()
    server.close()
    await server.wait_closed()
    await asyncio.sleep(0.05)  # let the transports close


def test_a_pooled_connection_the_node_closed_is_resent_on_a_new_one() -> None:
    async def main() -> None:
        served = []

        async def once_per_connection(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            body = await read_request(r)
            served.append(body)
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await w.drain()
            w.close()  # as uvicorn does to an idle keep-alive connection

        server, url = await serve(once_per_connection)
        client = NodeClient(url, 1.0)
        for i in range(3):
            r = await client.request("POST", "/x", {}, f"b{i}".encode())
            assert (r.status, r.body) == (200, b"ok")
        assert served == [b"b0", b"b1", b"b2"]  # each sent once
        await finish(client, server)

    asyncio.run(main())


def test_chunked_bodies_and_204_without_a_body() -> None:
    async def main() -> None:
        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                await read_request(r)
                w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                w.write(b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n")
                await read_request(r)
                w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await w.drain()
                await r.read()
            finally:
                w.close()

        server, url = await serve(handler)
        client = NodeClient(url, 1.0)
        r = await client.request("GET", "/a", {}, None, stream=True)
        assert r.stream is not None
        assert b"".join([c async for c in r.stream]) == b"abcde"
        r = await client.request("DELETE", "/b", {}, None)
        assert (r.status, r.body) == (204, b"")
        await finish(client, server)

    asyncio.run(main())


def test_a_node_that_is_not_there_fails_fast() -> None:
    async def main() -> None:
        async def nothing(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.close()

        server, url = await serve(nothing)
        server.close()
        await server.wait_closed()
        client = NodeClient(url, 1.0)

        async def body() -> AsyncIterator[bytes]:
            yield b"x"

        with pytest.raises(TransportFailed):
            await client.request("POST", "/x", {}, body())

    asyncio.run(main())
