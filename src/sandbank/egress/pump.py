"""The egress proxy's data plane: a process of its own that moves the bytes of checked connections.

The proxy (`proxy.py`) reads each request, checks it against the session's policy, resolves the
name and connects, in the server's event loop. A connection it then only has to relay (a CONNECT
tunnel, or a plain request without a credential) is handed here: both sockets travel over a unix
socket (SCM_RIGHTS), and this process moves their bytes with splice(2), from socket to pipe to
socket inside the kernel, never through Python's buffers. So a sandbox downloading at full speed
costs the API's event loop nothing and pays no per-byte Python.

What the proxy enforced on those bytes, this process enforces: the byte limit of a plain
request's body, each session's byte allowance, the rate shared by every session (a bucket of its
own: the proxy's loop keeps one for the bytes it moves itself, a credential's requests), and the
idle timeout. It reports what it moved, per connection, every REPORT_SECONDS and at the
connection's end, so the proxy's counters and logs stay exact; a session's allowance is checked
against what the proxy last heard, so it may be passed by one report's worth of traffic.

The process is started by the proxy at its first hand-off and ends when the proxy closes or the
server dies (its control socket's end). It gives up root before it reads a message: it needs no
privilege to move bytes between descriptors it is given. If it dies, the connections it held end
with it, and the proxy relays in its own loop until a new one has started.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MESSAGE_MAX = 256 * 1024  # one control message: a small header and the bytes read ahead
PIPE_SIZE = 256 * 1024  # each direction's pipe (pipe-user-pages-soft allows 64 MiB a user)
F_SETPIPE_SZ = 1031
SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
REPORT_SECONDS = 0.1
RESTART_SECONDS = 5.0  # after the process died, the proxy relays itself this long before a retry
NOBODY = 65534

Moved = Callable[[int, int], None]  # bytes out (sandbox to upstream), bytes in


# --- the proxy's side ---------------------------------------------------------------------
@dataclass
class Handed:
    done: asyncio.Future[None]
    moved: Moved


@dataclass
class Pump:
    """The proxy's handle on the data-plane process: hands connections over, hears back."""

    rate_bytes: int
    idle_seconds: float
    _sock: socket.socket | None = None
    _proc: subprocess.Popen[bytes] | None = None
    _handed: dict[int, Handed] = field(default_factory=dict)
    _next: int = 0
    _died_at: float = -RESTART_SECONDS

    def hand(
        self,
        sandbox_id: str,
        client: socket.socket,
        upstream: socket.socket,
        *,
        limit: int | None,
        budget: int,
        to_upstream: bytes,
        to_client: bytes,
        moved: Moved,
    ) -> asyncio.Future[None] | None:
        """Give the pump a connection: `to_upstream` and `to_client` are bytes already read that
        it sends first; at most `limit` bytes go upstream after them (None: no limit), and
        `budget` is what the session may still move. The future is done when the connection
        has ended; None if it could not be handed over (the caller relays it itself)."""
        sock = self._running()
        if sock is None:
            return None
        self._next += 1
        header = {
            "op": "relay", "id": self._next, "sandbox": sandbox_id, "limit": limit,
            "budget": budget, "up": len(to_upstream), "down": len(to_client),
        }  # fmt: skip
        message = json.dumps(header).encode() + b"\n" + to_upstream + to_client
        if len(message) > MESSAGE_MAX:
            return None
        try:
            socket.send_fds(sock, [message], [client.fileno(), upstream.fileno()])
        except (BlockingIOError, OSError):
            return None  # full or gone: relayed in the loop this once
        done = asyncio.get_running_loop().create_future()
        self._handed[self._next] = Handed(done, moved)
        return done

    def cancel(self, done: asyncio.Future[None]) -> None:
        """End a handed connection now (its session is closing)."""
        for key, handed in list(self._handed.items()):
            if handed.done is done:
                self._send({"op": "close", "id": key})

    def forget(self, sandbox_id: str) -> None:
        self._send({"op": "forget", "sandbox": sandbox_id})

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        self._ended()  # the process sees its control socket end, ends its connections and exits
        if proc is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(proc.wait), 5.0)
            except TimeoutError:
                proc.kill()
                await asyncio.to_thread(proc.wait)

    def _send(self, header: dict[str, object]) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.send(json.dumps(header).encode() + b"\n")

    def _running(self) -> socket.socket | None:
        if self._sock is not None:
            return self._sock
        if time.monotonic() - self._died_at < RESTART_SECONDS:
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "sandbank.egress.pump", str(theirs.fileno()),
                 str(self.rate_bytes), str(self.idle_seconds)],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=child_env(),
            )  # fmt: skip
        except OSError as e:
            log.warning("egress: the data-plane process did not start (%s); relaying in-loop", e)
            ours.close()
            self._died_at = time.monotonic()
            return None
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        asyncio.get_running_loop().add_reader(ours, self._readable)
        return ours

    def _readable(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(MESSAGE_MAX)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                log.warning("egress: the data-plane process ended; its connections ended with it")
                self._ended()
                return
            report = json.loads(data)
            for key, out, into in report.get("moved", ()):
                handed = self._handed.get(key)
                if handed is not None:
                    handed.moved(out, into)
            for key in report.get("done", ()):
                ended = self._handed.pop(key, None)
                if ended is not None and not ended.done.done():
                    ended.done.set_result(None)

    def _ended(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(RuntimeError):  # the loop may be closed
                asyncio.get_running_loop().remove_reader(self._sock)
            self._sock.close()
            self._sock = None
            self._died_at = time.monotonic()
        for handed in self._handed.values():
            if not handed.done.done():
                handed.done.set_result(None)
        self._handed.clear()
        if self._proc is not None:  # it exits when its socket ends: reaped beside the loop
            threading.Thread(target=self._proc.wait, daemon=True).start()
            self._proc = None


def child_env() -> dict[str, str]:
    """Where to find Python and this package; none of the server's settings and keys."""
    keep = ("PATH", "PYTHONPATH", "LANG", "LC_ALL")
    return {k: v for k, v in os.environ.items() if k in keep}


# --- the process ----------------------------------------------------------------------------
class Bucket:
    """Every session's bytes together: at most `rate` a second, in bursts of one second's."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.tokens = float(rate)
        self.stamp = time.monotonic()

    def take(self, n: int) -> float:
        """Count `n` bytes moved; the seconds to wait before moving more."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        self.tokens = min(float(self.rate), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        return -self.tokens / self.rate if self.tokens < 0 else 0.0


@dataclass
class Sandbox:
    budget: int  # bytes it may still move
    connections: set[Connection] = field(default_factory=set)


class Direction:
    """One way of a connection: `src` to `dst` through a pipe, with splice."""

    def __init__(
        self, conn: Connection, src: int, dst: int, out: bool, limit: int | None, first: bytes
    ) -> None:
        self.conn, self.src, self.dst, self.out, self.left = conn, src, dst, out, limit
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.w, F_SETPIPE_SZ, PIPE_SIZE)
        self.first = first  # read ahead by the proxy: sent before anything else
        self.held = 0  # bytes in the pipe
        self.reading = self.writing = self.paused = self.eof = False
        self.loop = asyncio.get_running_loop()

    def _read(self, on: bool) -> None:
        if on and not self.reading:
            self.loop.add_reader(self.src, self._readable)
        elif not on and self.reading:
            self.loop.remove_reader(self.src)
        self.reading = on

    def _write(self, on: bool) -> None:
        if on and not self.writing:
            self.loop.add_writer(self.dst, self.flush)
        elif not on and self.writing:
            self.loop.remove_writer(self.dst)
        self.writing = on

    def _readable(self) -> None:
        # Never more than the session may still move (and one byte to see it is over).
        want = min(PIPE_SIZE, max(self.conn.sandbox.budget, 0) + 1)
        if self.left is not None:
            want = min(want, self.left)
        try:
            n = os.splice(self.src, self.w, want, flags=SPLICE)
        except BlockingIOError:
            return
        except OSError:
            self.conn.end()
            return
        if n == 0:
            self.eof = True
        else:
            self.held += n
            if self.left is not None:
                self.left -= n
            pause = self.conn.moved(self, n)
            if self.conn.over:
                return
            if pause > 0:  # the shared rate: this direction waits its turn
                self.paused = True
                self._read(False)
                self.loop.call_later(pause, self._resume)
        self.flush()

    def _resume(self) -> None:
        self.paused = False
        if not self.conn.over and not self.writing:
            self.flush()

    def flush(self) -> None:
        """Send what is held; then read on, or pass the end on."""
        try:
            while self.first:
                self.first = self.first[os.write(self.dst, self.first) :]
            while self.held:
                self.held -= os.splice(self.r, self.dst, self.held, flags=SPLICE)
        except BlockingIOError:
            self._read(False)  # the peer is slow: read no more until it has taken this
            self._write(True)
            return
        except OSError:
            self.conn.end()
            return
        self._write(False)
        if self.eof or self.left == 0:
            self._read(False)
            if self.eof and self.out:  # passed on upstream, which may still answer
                with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self.dst)) as s:
                    s.shutdown(socket.SHUT_WR)
            self.conn.direction_ended(self)  # the answer's end is the connection's
        elif not self.paused:
            self._read(True)

    def close(self) -> None:
        self._read(False)
        self._write(False)
        os.close(self.r)
        os.close(self.w)


class Connection:
    """A sandbox's connection and its upstream: two directions; over when the answer ends."""

    def __init__(
        self, plane: Plane, key: int, sandbox: Sandbox, client: int, upstream: int
    ) -> None:
        self.plane, self.key, self.sandbox = plane, key, sandbox
        self.client, self.upstream = client, upstream
        self.out = self.into = 0  # not yet reported
        self.last = time.monotonic()
        self.over = False
        self.up: Direction | None = None
        self.down: Direction | None = None

    def start(self, limit: int | None, to_upstream: bytes, to_client: bytes) -> None:
        self.up = Direction(self, self.client, self.upstream, True, limit, to_upstream)
        self.down = Direction(self, self.upstream, self.client, False, None, to_client)
        self.up.flush()
        if not self.over:
            self.down.flush()

    def moved(self, direction: Direction, n: int) -> float:
        self.last = time.monotonic()
        if direction.out:
            self.out += n
        else:
            self.into += n
        self.plane.unreported[self.key] = self
        self.sandbox.budget -= n
        if self.sandbox.budget < 0:  # its allowance is used: all its connections end
            for conn in list(self.sandbox.connections):
                conn.end()
            return 0.0
        return self.plane.bucket.take(n)

    def direction_ended(self, direction: Direction) -> None:
        # The sandbox may finish sending first and still read the answer; once the answer
        # is over, so is the connection.
        if direction is self.down:
            self.end()

    def end(self) -> None:
        if self.over:
            return
        self.over = True
        for d in (self.up, self.down):
            if d is not None:
                d.close()
        self.sandbox.connections.discard(self)
        # Reported before the sandbox sees the end, so its next request meets exact counters.
        self.plane.ended(self)
        for fd in (self.client, self.upstream):
            os.close(fd)


class Plane:
    """The process's state: its connections by key, their sandboxes, what is to report."""

    def __init__(self, control: socket.socket, rate: int, idle: float) -> None:
        self.control = control
        self.bucket = Bucket(rate)
        self.idle = idle
        self.connections: dict[int, Connection] = {}
        self.sandboxes: dict[str, Sandbox] = {}
        self.unreported: dict[int, Connection] = {}
        self.finished: list[int] = []
        self.closed = asyncio.get_running_loop().create_future()

    def receive(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.control, MESSAGE_MAX, 2)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                if not self.closed.done():
                    self.closed.set_result(None)
                return
            head, _, rest = data.partition(b"\n")
            message = json.loads(head)
            if message["op"] == "relay" and len(fds) == 2:
                self.relay(message, fds, rest)
            else:
                for fd in fds:
                    os.close(fd)
                if message["op"] == "close" and message["id"] in self.connections:
                    self.connections[message["id"]].end()
                elif message["op"] == "forget":
                    sandbox = self.sandboxes.pop(message["sandbox"], None)
                    for conn in list(sandbox.connections if sandbox else ()):
                        conn.end()

    def relay(self, message: dict[str, object], fds: list[int], rest: bytes) -> None:
        key, name, budget = message["id"], message["sandbox"], message["budget"]
        up, limit = message["up"], message["limit"]
        assert isinstance(key, int) and isinstance(name, str) and isinstance(budget, int)
        assert isinstance(up, int) and (limit is None or isinstance(limit, int))
        sandbox = self.sandboxes.setdefault(name, Sandbox(budget))
        # What it moved since the proxy last heard is not in the proxy's figure yet; what the
        # proxy moved itself since the last hand-off is not in this one's.
        pending = sum(c.out + c.into for c in sandbox.connections)
        sandbox.budget = min(sandbox.budget, budget - pending)
        for fd in fds:
            os.set_blocking(fd, False)
        conn = Connection(self, key, sandbox, fds[0], fds[1])
        self.connections[key] = conn
        sandbox.connections.add(conn)
        conn.start(limit, rest[:up], rest[up:])

    def ended(self, conn: Connection) -> None:
        self.connections.pop(conn.key, None)
        self.finished.append(conn.key)
        self.unreported[conn.key] = conn
        self.report()

    def report(self) -> None:
        moved = [[c.key, c.out, c.into] for c in self.unreported.values() if c.out or c.into]
        for c in self.unreported.values():
            c.out = c.into = 0
        self.unreported.clear()
        done, self.finished = self.finished, []
        if not (moved or done):
            return
        sent = send(self.control, json.dumps({"moved": moved, "done": done}).encode())
        if not sent and not self.closed.done():  # the proxy is gone
            self.closed.set_result(None)

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(REPORT_SECONDS)
            self.report()
            now = time.monotonic()
            for conn in list(self.connections.values()):
                if now - conn.last > self.idle:
                    conn.end()


def send(control: socket.socket, data: bytes) -> bool:
    """One report; the proxy reads them at once, so a full socket is waited out briefly."""
    for _ in range(100):
        try:
            control.send(data)
            return True
        except BlockingIOError:
            select.select([], [control], [], 0.1)
        except OSError:
            return False
    return False


async def serve(fd: int, rate: int, idle: float) -> None:
    control = socket.socket(fileno=fd)
    control.setblocking(False)
    plane = Plane(control, rate, idle)
    loop = asyncio.get_running_loop()
    loop.add_reader(control, plane.receive)
    ticker = asyncio.create_task(plane.tick())
    try:
        await plane.closed
    finally:
        ticker.cancel()
        for conn in list(plane.connections.values()):
            conn.end()


def drop_privileges() -> None:
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


if __name__ == "__main__":
    os.nice(10)  # bytes wait for API calls, never the other way round
    drop_privileges()
    asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
