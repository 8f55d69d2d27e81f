"""A hostile user of the interpreter API against a real server: quotas raced with concurrent
requests, bodies sent without credentials, forms flooded with fields."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Client, Server, openai_env, running
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


def _at_once(calls: list[httpx.Request]) -> list[httpx.Response]:
    """Send every request at the same moment, each on a connection of its own."""
    barrier = threading.Barrier(len(calls))
    answers: list[httpx.Response | None] = [None] * len(calls)

    def send(i: int) -> None:
        with httpx.Client(timeout=60) as client:
            barrier.wait()
            answers[i] = client.send(calls[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [a for a in answers if a is not None]


def test_uploads_sent_at_once_never_store_more_than_the_quota(server: Server) -> None:
    with server.new_user() as user:
        sid = user.new_session()
        forms = [
            user.ok("GET", f"/api/sessions/{sid}/files/upload", params={"filename": f"f{i}.csv"})
            for i in range(6)
        ]
        # Each form allows the whole quota (nothing is stored yet): 6 x 100 KB sent at once.
        requests = [
            httpx.Request(
                "POST",
                form["url"],
                data=form["fields"],
                files={"file": (f"f{i}.csv", b"x" * 100_000)},
            )
            for i, form in enumerate(forms)
        ]
        answers = _at_once(requests)
        statuses = sorted(a.status_code for a in answers)
        stored = user.ok("GET", f"/api/sessions/{sid}/files")
        assert sum(f["size"] for f in stored) <= QUOTA
        assert statuses.count(204) == len(stored) >= 1, statuses
        refused = [a for a in answers if a.status_code != 204]
        assert all(a.status_code == 409 for a in refused), [a.text for a in refused]
        assert all(a.json()["error_code"] == 1112 for a in refused)  # quota_exceeded
        # The refused uploads gave their reservations back: once the files go, the whole
        # quota is free again.
        user.ok("DELETE", f"/api/sessions/{sid}")
        fresh = user.new_session()
        assert user.upload(fresh, "all.csv", b"y" * QUOTA).status_code == 204
        full = user.http.get(f"/api/sessions/{fresh}/files/upload", params={"filename": "more.csv"})
        assert full.status_code == 409 and full.json()["error_code"] == 1112


def test_sessions_created_at_once_never_pass_the_users_limit(server: Server) -> None:
    with server.new_user() as user:
        auth = {"Authorization": f"Bearer {user.key}"}
        requests = [
            httpx.Request("POST", f"{server.url}/api/sessions", headers=auth) for _ in range(12)
        ]
        statuses = sorted(a.status_code for a in _at_once(requests))
        assert statuses == [200] * 3 + [409] * 9
        assert len(user.ok("GET", "/api/sessions")) == 3


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


def test_the_agent_is_told_what_the_sessions_network_policy_allows(
    llm: FakeLLM, machine: None
) -> None:
    env = {**openai_env(llm.url), "SANDBANK_EGRESS_ALLOW": "api.example.com:443"}
    with running(env) as server, server.new_user() as user:
        sid = user.new_session()
        user.ask(sid, "hello")
        assert user.wait(sid)["status"] == "DONE"
    system = next(m["content"] for m in llm.requests[-1]["messages"] if m["role"] == "system")
    assert "only to api.example.com:443 (HOST:PORT)" in system
    assert "no internet" not in system.lower()


def test_event_streams_are_capped_per_user_and_in_all(llm: FakeLLM, machine: None) -> None:
    env = {
        **openai_env(llm.url),
        "SANDBANK_MAX_EVENT_STREAMS_PER_USER": "2",
        "SANDBANK_MAX_EVENT_STREAMS": "3",
    }
    with running(env) as server, server.new_user() as alice, server.new_user() as bob:
        mine, theirs = alice.new_session(), bob.new_session()
        alice.ask(mine, "sleep")  # runs for minutes: its streams stay open
        bob.ask(theirs, "sleep")
        with contextlib.ExitStack() as streams:

            def open_stream(user: Client, sid: str) -> httpx.Response:
                response = streams.enter_context(
                    user.http.stream("GET", f"/api/sessions/{sid}/events", timeout=30)
                )
                if response.status_code != 200:
                    response.read()
                return response

            first = open_stream(alice, mine)
            assert [first.status_code, open_stream(alice, mine).status_code] == [200, 200]
            third = open_stream(alice, mine)
            assert third.status_code == 429 and third.json()["error_code"] == 1052
            assert open_stream(bob, theirs).status_code == 200
            full = open_stream(bob, theirs)  # 3 open on the server
            assert full.status_code == 503 and full.headers["retry-after"] == "5"
            first.close()  # a stream closed by its client gives its slot back
            deadline = time.monotonic() + 10
            while (again := open_stream(bob, theirs)).status_code == 503:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert again.status_code == 200
        alice.ok("POST", f"/api/sessions/{mine}/cancel")
        bob.ok("POST", f"/api/sessions/{theirs}/cancel")
