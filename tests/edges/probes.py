"""What a hostile client does at the server's edge, and what the server then holds."""

from __future__ import annotations

import contextlib
import os
import socket


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def connect(port: int, source: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    """A connection from `source` (any 127.x.y.z address is this machine's)."""
    conn = socket.create_connection(("127.0.0.1", port), timeout, (source, 0))
    return conn


def read_response(conn: socket.socket, limit: int = 1 << 16) -> bytes:
    """What the server sends until it closes, or `limit` bytes (b"" on a reset)."""
    data = b""
    with contextlib.suppress(OSError):
        while len(data) < limit:
            chunk = conn.recv(limit - len(data))
            if not chunk:
                break
            data += chunk
    return data


def exchange(port: int, request: bytes, source: str = "127.0.0.1") -> bytes:
    """Send a request as written (no client library normalises it) and read the answer."""
    with connect(port, source) as conn:
        conn.sendall(request)
        return read_response(conn)


def get(path: str, headers: bytes = b"", close: bool = True) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return (
        b"GET "
        + path.encode()
        + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + connection
        + headers
        + b"\r\n"
    )


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def read_one(conn: socket.socket) -> bytes:
    """One whole response with a Content-Length, the connection left open."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
