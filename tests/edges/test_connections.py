"""Connections: capped overall and per client address below the descriptors the sandboxes
need, a 503 beyond; an answer sent before its request's body ends the connection."""

from __future__ import annotations

import contextlib
import select
import socket
import time

from tests.edges.conftest import EDGE, TOKEN, Edge
from tests.edges.probes import connect, exchange, get, open_fds, read_response, status_of

MiB = 1 << 20
PER_CLIENT: int = EDGE["max_connections_per_client"]
TOTAL: int = EDGE["max_connections"]


def _hold(port: int, source: str, count: int) -> list[socket.socket]:
    return [connect(port, source) for _ in range(count)]


def _refused(conns: list[socket.socket]) -> list[bytes]:
    """The answers of the connections the server closed at once (it says why); the others
    have nothing to read (well within the head timeout)."""
    readable, _, _ = select.select(conns, [], [], 0.2)
    return [read_response(conn) for conn in readable]


def test_past_its_address_cap_a_client_gets_503_and_others_are_still_served(
    server: Edge,
) -> None:
    before = open_fds(server.pid)
    conns = _hold(server.port, "127.0.0.1", PER_CLIENT + 15)
    try:
        time.sleep(0.2)
        # The server holds what it admitted and no more (it serves in this process: the
        # clients' own sockets are counted apart).
        assert open_fds(server.pid) - before - len(conns) <= PER_CLIENT + 2
        answers = _refused(conns)
        assert len(answers) == 15
        assert all(status_of(a) == 503 for a in answers), answers[:1]
        assert all(b"this address holds its most connections (30)" in a for a in answers)
        assert all(b"retry-after: 5" in a for a in answers)
        # Another address is served meanwhile.
        assert status_of(exchange(server.port, get("/health"), "127.0.0.2")) == 200
    finally:
        for conn in conns:
            conn.close()


def test_a_full_server_makes_room_by_closing_a_waiting_connection_of_the_largest_holder(
    server: Edge,
) -> None:
    """Slow connections from a few addresses fill the server: a newcomer takes the place of
    one of them (the address holding the most), and no other newcomer is kept out."""
    hog = _hold(server.port, "127.0.0.3", PER_CLIENT)
    for conn in hog:
        conn.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")  # a slow head, still coming
    other = _hold(server.port, "127.0.0.4", TOTAL - PER_CLIENT - 5)
    other += _hold(server.port, "127.0.0.8", 5)
    try:
        time.sleep(0.2)
        answers = [exchange(server.port, get("/health"), f"127.0.0.{5 + i}") for i in range(3)]
        assert [status_of(a) for a in answers] == [200, 200, 200]
        assert not _refused(other)
        closed = _refused(hog)
        assert closed and all(b"this waiting connection made room" in a for a in closed)
    finally:
        for conn in hog + other:
            conn.close()


def test_past_the_servers_cap_with_no_address_over_its_share_a_newcomer_gets_503(
    server: Edge,
) -> None:
    conns = [connect(server.port, f"127.0.1.{i + 1}") for i in range(TOTAL)]
    try:
        time.sleep(0.2)
        refused = exchange(server.port, get("/health"), "127.0.2.1")
        assert status_of(refused) == 503
        assert f"the server holds its most connections ({TOTAL})".encode() in refused
        assert not _refused(conns)  # nobody gave way: each holds one
    finally:
        for conn in conns:
            conn.close()
    time.sleep(0.2)
    assert status_of(exchange(server.port, get("/health"), "127.0.2.1")) == 200


def _post_flood(port: int, path: str, headers: bytes, size: int) -> tuple[int, bytes]:
    """POST `size` bytes of body; how many went out before the server stopped reading, and
    its answer."""
    sent = 0
    with connect(port) as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {size}\r\n".encode()
            + headers
            + b"\r\n"
        )
        chunk = b"x" * MiB
        with contextlib.suppress(OSError):
            while sent < size:
                conn.sendall(chunk)
                sent += len(chunk)
        return sent, read_response(conn)


def test_an_answer_before_the_body_ends_the_connection_and_the_rest_is_not_read(
    server: Edge,
) -> None:
    unauthenticated = _post_flood(
        server.port,
        "/sessions/x/files",
        b"Content-Type: multipart/form-data; boundary=b\r\n",
        256 * MiB,
    )
    unknown = _post_flood(
        server.port,
        "/sessions/x/files",
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: multipart/form-data; boundary=b\r\n".encode(),
        256 * MiB,
    )
    for sent, answer in (unauthenticated, unknown):
        # The kernel's buffers and the linger allowance (1 MiB) went through, not 256 MiB.
        assert sent < 32 * MiB, sent
        assert status_of(answer) in (0, 401, 404), answer[:200]
    assert status_of(unauthenticated[1]) in (0, 401) and status_of(unknown[1]) in (0, 404)
    assert status_of(exchange(server.port, get("/health"))) == 200
