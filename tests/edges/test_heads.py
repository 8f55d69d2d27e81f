"""Request heads: too long, too many, too large or too slow are refused before they cost."""

from __future__ import annotations

import socket
import threading
import time

from tests.edges.conftest import Edge
from tests.edges.probes import (
    connect,
    exchange,
    get,
    read_one,
    read_response,
    rss_bytes,
    status_of,
)

MiB = 1 << 20


def test_a_request_line_past_8_kib_is_414_and_a_header_line_past_it_431(server: Edge) -> None:
    long_line = exchange(server.port, get("/health?" + "a" * 9000))
    assert status_of(long_line) == 414 and b"request line is longer than 8192" in long_line
    long_header = exchange(server.port, get("/health", b"X-Big: " + b"b" * 9000 + b"\r\n"))
    assert status_of(long_header) == 431 and b"header line is longer" in long_header
    # The interpreter API's requests are answered in its own error shape.
    api = exchange(server.port, get("/api/sessions", b"X-Big: " + b"b" * 9000 + b"\r\n"))
    assert status_of(api) == 431 and b'"error_code": 1007' in api
    assert status_of(exchange(server.port, get("/health"))) == 200


def test_more_than_100_headers_or_64_kib_of_them_is_431(server: Edge) -> None:
    many = exchange(server.port, get("/health", b"X-A: b\r\n" * 101))
    assert status_of(many) == 431 and b"at most 100 headers" in many
    large = exchange(
        server.port, get("/health", b"".join(b"X-%d: %s\r\n" % (i, b"c" * 8000) for i in range(9)))
    )
    assert status_of(large) == 431 and b"larger than 65536 bytes" in large
    assert status_of(exchange(server.port, get("/health", b"X-A: b\r\n" * 98))) == 200


def test_a_48_mib_header_is_refused_after_64_kib_and_the_rest_never_read(
    real_server: Edge,
) -> None:
    """On a real server: what its own process holds is the subject."""
    server = real_server
    before = rss_bytes(server.pid)
    conn = connect(server.port)
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Flood: ")
    sent = 0
    chunk = b"f" * MiB
    try:
        while sent < 48 * MiB:
            conn.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # the server closed: what it had not read is dropped by the kernel
    answer = read_response(conn)
    conn.close()
    # The answer came (unless the reset beat it to the socket), and the server stopped reading
    # long before the end: what got through is the kernel's socket buffers, not 48 MiB.
    assert status_of(answer) in (431, 0), answer[:200]
    assert sent < 16 * MiB, sent
    assert rss_bytes(server.pid) - before < 16 * MiB
    assert status_of(exchange(server.port, get("/health"))) == 200


def test_a_head_sent_a_byte_at_a_time_is_408_once_the_head_timeout_passes(server: Edge) -> None:
    conn = connect(server.port)
    start = time.monotonic()
    answer = b""
    try:
        for byte in get("/health"):
            conn.sendall(bytes([byte]))
            time.sleep(0.1)  # 60 bytes: 6 s, well past the 1.5 s allowed
            if time.monotonic() - start > 8:
                break
    except OSError:
        pass
    answer = read_response(conn)
    conn.close()
    assert status_of(answer) == 408, answer
    assert b"did not arrive within 1.5 s" in answer


def test_a_silent_connection_and_an_idle_keep_alive_one_are_closed(server: Edge) -> None:
    with connect(server.port) as silent:
        assert read_response(silent) == b""  # closed after the head timeout, nothing said
    with connect(server.port) as idle:
        idle.sendall(get("/health", close=False))
        assert status_of(read_one(idle)) == 200
        assert idle.recv(1) == b""  # closed by the keep-alive timeout (1 s here)


def test_many_slow_heads_at_once_leave_the_server_answering(server: Edge) -> None:
    """Slow clients, each sending a byte now and then, cost a connection each until the head
    timeout: the server answers a well-behaved client meanwhile."""
    stop = threading.Event()
    conns: list[socket.socket] = []

    def trickle() -> None:
        while not stop.is_set():
            for conn in list(conns):
                try:
                    conn.send(b"X")
                except OSError:
                    conns.remove(conn)
                    conn.close()
            time.sleep(0.2)

    for _ in range(25):
        conn = connect(server.port)
        conn.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")
        conns.append(conn)
    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        answers = [status_of(exchange(server.port, get("/health"), "127.0.0.2")) for _ in range(5)]
        assert answers == [200] * 5
        time.sleep(2.5)  # past the head timeout: every slow head was answered 408 and closed
        assert not conns
    finally:
        stop.set()
        thread.join()
        for conn in conns:
            conn.close()
