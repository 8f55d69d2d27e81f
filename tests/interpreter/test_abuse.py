"""A hostile user of the interpreter API against a real server: forms flooded with fields, sent
with and without a signed URL, and what the server's process holds meanwhile. Quotas raced with
concurrent requests and capped event streams are tested over fakes in test_abuse_http.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.interpreter.harness import Server, running
from tests.tiers import needs

QUOTA = 200_000
MiB = 1 << 20


@pytest.fixture(scope="module")
@needs("root")
def server() -> Iterator[Server]:
    env = {
        "SANDBANK_MAX_STORED_BYTES_PER_USER": str(QUOTA),
        "SANDBANK_MAX_SESSIONS_PER_USER": "3",
    }
    with running(env) as started:
        yield started


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # the kernel's high-water mark of resident memory restarts from now


def _fields(count: int, value: bytes) -> tuple[bytes, str]:
    boundary = "flood"
    part = b'--flood\r\nContent-Disposition: form-data; name="f%d"\r\n\r\n%s\r\n'
    return b"".join(part % (i, value) for i in range(count)) + b"--flood--\r\n", boundary


def _post_raw(
    port: int, target: str, body: bytes, boundary: str, chunked: bool = False
) -> tuple[bytes, int]:
    """The answer, and how much of the body went out before the server stopped reading.
    `chunked`: the body declares no length (one chunk)."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{framing}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n"
    ).encode()
    if chunked:
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    sent = 0
    with socket.create_connection(("127.0.0.1", port), 30) as conn:
        conn.sendall(head)
        try:
            while sent < len(body):
                sent += conn.send(body[sent : sent + MiB])
        except OSError:
            pass  # the server answered and closed
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except OSError:
            pass
    return answer, sent


def test_a_field_flood_without_a_signed_url_is_refused_before_its_body_is_read(
    server: Server,
) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    # 16,000 fields, a few KiB each: 64 MiB the server never reads.
    body, boundary = _fields(16_000, b"v" * 4000)
    _reset_peak(pid)
    before = _peak_rss(pid)
    answer, sent = _post_raw(server.port, "/api/uploads", body, boundary)
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert b"this upload URL is not signed" in answer
    assert sent < 32 * MiB, sent  # the kernel's buffers and a 1 MiB linger, not 64 MiB
    assert _peak_rss(pid) - before < 8 * MiB


def test_a_field_flood_with_a_signed_url_stops_at_the_parts_cap(server: Server) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    with server.new_user() as user:
        sid = user.new_session()
        form = user.ok("GET", f"/api/sessions/{sid}/files/upload", params={"filename": "a.csv"})
        target = form["url"].removeprefix(server.url)
        _reset_peak(pid)
        before = _peak_rss(pid)
        # Declared larger than the form allows: refused before reading (413).
        body, boundary = _fields(16_000, b"v")
        answer, _ = _post_raw(server.port, target, body, boundary)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        # Within it, or declaring nothing: refused at the 17th part (400).
        for fields, chunked in ((3_000, False), (16_000, True)):
            body, boundary = _fields(fields, b"v")
            answer, _ = _post_raw(server.port, target, body, boundary, chunked)
            assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
            assert b"more than 16 parts" in answer
        # A part whose headers go on and on: three of 3,000 bytes pass 8 KiB together.
        pad = b"p" * 3000
        huge_head = (
            b'--flood\r\nContent-Disposition: form-data; name="f"\r\nX-A: %s\r\nX-B: %s'
            b"\r\nX-C: %s\r\n\r\nv\r\n--flood--\r\n" % (pad, pad, pad)
        )
        answer, _ = _post_raw(server.port, target, huge_head, "flood")
        assert answer.startswith(b"HTTP/1.1 400") and b"headers are larger" in answer
        assert _peak_rss(pid) - before < 8 * MiB
        assert user.ok("GET", f"/api/sessions/{sid}/files") == []
