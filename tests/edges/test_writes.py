"""A response leaves in as few sends as it can: its head with its first body bytes (on
loopback each send wakes the reader), yet nothing waits that a client is waiting for."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from sandbank.http.edge import HeadWithBody
from tests.edges.conftest import TOKEN, Edge
from tests.edges.probes import connect, get, read_one, status_of


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch, server: Edge) -> list[bytes]:
    """What the server's sockets send, one item per system call (the server runs in a thread of
    this process; asyncio's transports call `socket.send`)."""
    seen: list[bytes] = []
    real = socket.socket.send

    def send(sock: socket.socket, data: bytes, *flags: int) -> int:
        n = real(sock, data, *flags)
        try:
            ours = sock.getsockname()[1] == server.port
        except OSError:
            ours = False
        if ours:
            seen.append(bytes(data[:n]))
        return n

    monkeypatch.setattr(socket.socket, "send", send)
    return seen


def test_a_responses_head_and_body_leave_in_one_send(server: Edge, sends: list[bytes]) -> None:
    with connect(server.port) as conn:
        for _ in range(3):  # on one keep-alive connection
            conn.sendall(get("/health", close=False))
            answer = read_one(conn)
            assert status_of(answer) == 200
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["status"] == "ok"
    assert len(sends) == 3
    assert all(s.startswith(b"HTTP/1.1 200") and s.endswith(b"}") for s in sends)


def test_a_head_request_is_answered_and_its_connection_serves_on(server: Edge) -> None:
    with connect(server.port) as conn:
        conn.sendall(get("/health", close=False).replace(b"GET", b"HEAD", 1))
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            assert chunk, "the connection closed before the head arrived"
            head += chunk
        assert status_of(head) == 200
        assert head.endswith(b"\r\n\r\n")  # no body follows a HEAD's head
        conn.sendall(get("/health", close=False))
        assert status_of(read_one(conn)) == 200


def test_100_continue_goes_at_once_before_the_body_is_sent(server: Edge) -> None:
    body = b"{}"
    with connect(server.port, timeout=5) as conn:
        conn.sendall(
            b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n".encode()
            + b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        # The client sends its body only once told to: a held 100 would hang both sides.
        assert conn.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        conn.sendall(body)
        answer = read_one(conn)
        assert status_of(answer) == 201, answer[:300]
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["session_id"]


class _Transport:
    """A transport that records what is written to it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Cycle:
    response_started = False


def test_a_held_head_goes_alone_within_one_turn_when_no_body_follows_it() -> None:
    """A streamed response whose first chunk is slow: its client sees the head at once."""

    async def scenario() -> list[list[bytes]]:
        real, cycle = _Transport(), _Cycle()
        transport = HeadWithBody(real, cycle, asyncio.get_running_loop())  # type: ignore[arg-type]
        cycle.response_started = True
        transport.write(b"HEAD")
        held = list(real.writes)
        await asyncio.sleep(0)
        after_a_turn = list(real.writes)
        transport.write(b"chunk")
        assert not transport.is_closing()  # the rest of the transport is the real one's
        transport.close()
        return [held, after_a_turn, real.writes, [b"closed"] if real.closed else []]

    held, after_a_turn, writes, closed = asyncio.run(scenario())
    assert held == []
    assert after_a_turn == [b"HEAD"]
    assert writes == [b"HEAD", b"chunk"]
    assert closed == [b"closed"]


def test_a_held_head_is_written_before_the_connection_closes() -> None:
    async def scenario() -> list[bytes]:
        real, cycle = _Transport(), _Cycle()
        transport = HeadWithBody(real, cycle, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before the response: not held
        cycle.response_started = True
        transport.write(b"HEAD")
        transport.close()
        await asyncio.sleep(0)  # the turn's flush finds nothing left to write
        return real.writes

    assert asyncio.run(scenario()) == [b"HTTP/1.1 100 Continue\r\n\r\n", b"HEAD"]
