"""Output capture: each call's output, kept apart from what was written while no call ran.

Bash's stdout and stderr are pipes drained for the shell's whole life, and a command's output
lies between two markers the shell itself prints (`Stream`): it writes asynchronously, so only
its own marker says where a command's output ends.

Python's fds 1 and 2 are such pipes too (a child process, C code or `os.write` writes into
them), but Python's own `sys.stdout` and `sys.stderr` write into the call's output directly
(`FdStream`): a `print` costs no system call and no thread hand-off, and a call starts and ends
by taking what the pipe holds under the stream's lock (dropped before, kept after) instead of
writing markers and waiting for a reader thread to see them. That is most of a warm call's
system calls, each a trap into the Sentry under gVisor (~75 us there).
"""

from __future__ import annotations

import codecs
import errno
import fcntl
import io
import os
import secrets
import select
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

_WAIT, _COLLECT, _IDLE = 0, 1, 2


class Kept:
    """One call's output of one stream: at most `limit` bytes, the rest counted; `live` gets
    the text as it comes."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.begin(0, None)

    def begin(self, limit: int, live: Callable[[str], None] | None) -> None:
        self.limit = limit
        self.live = live
        self._decoder.reset()
        self.data = bytearray()
        self.dropped = 0

    def keep(self, data: bytes) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            kept = data[:room]
            self.data += kept
            if self.live is not None and kept:
                text = self._decoder.decode(kept)
                if text:
                    self.live(text)
        self.dropped += max(0, len(data) - max(room, 0))

    def text(self) -> str:
        out = self.data.decode("utf-8", errors="replace")
        if self.dropped:
            out += f"\n[output truncated: {self.dropped} more bytes not shown]\n"
        self.data = bytearray()
        return out


class Stream(threading.Thread):
    """Drains one pipe; between `begin`'s start marker and its end marker it keeps the output."""

    def __init__(self, r: int) -> None:
        super().__init__(daemon=True)
        self.r = r
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.start_marker = self.end_marker = b""
        self.state = _IDLE
        self.kept = Kept()
        self.tail = b""
        self.ended = False
        self.start()

    def begin(
        self, markers: tuple[bytes, bytes], limit: int, live: Callable[[str], None] | None = None
    ) -> None:
        with self.lock:
            self.start_marker, self.end_marker = markers
            self.kept.begin(limit, live)
            self.tail = b""
            self.state = _WAIT
            self.done.clear()

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.r, 65536)
            except OSError:
                chunk = b""
            with self.lock:
                if not chunk:  # every writer is gone (bash exited): the call's output ends here
                    if self.state == _COLLECT:
                        self.kept.keep(self.tail)
                    self.tail = b""
                    self.ended = True
                    self.state = _IDLE
                    self.done.set()
                    os.close(self.r)
                    return
                self._consume(chunk)

    def _consume(self, chunk: bytes) -> None:
        buf = self.tail + chunk
        self.tail = b""
        while buf:
            if self.state == _IDLE:
                return  # between calls: nobody is listening
            marker = self.start_marker if self.state == _WAIT else self.end_marker
            idx = buf.find(marker)
            if idx < 0:
                keep = _partial(buf, marker)  # the marker may be split across reads
                if self.state == _COLLECT:
                    self.kept.keep(buf[: len(buf) - keep])
                self.tail = buf[len(buf) - keep :]
                return
            if self.state == _COLLECT:
                self.kept.keep(buf[:idx])
                self.state = _IDLE
                self.done.set()
            else:
                self.state = _COLLECT
            buf = buf[idx + len(marker) :]

    def text(self, timeout: float = 2.0) -> str:
        self.done.wait(timeout)
        with self.lock:
            return self.kept.text()


def _partial(buf: bytes, marker: bytes) -> int:
    """How many bytes at the end of `buf` could be the start of `marker` (held back for now)."""
    start = max(0, len(buf) - len(marker) + 1)
    at = buf.find(marker[:1], start)  # usually none: the markers start with NUL or `__`
    while at >= 0:
        if marker.startswith(buf[at:]):
            return len(buf) - at
        at = buf.find(marker[:1], at + 1)
    return 0


def above_stdio(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def new_markers() -> tuple[bytes, bytes]:
    """A command's (start, end) markers, printed by the shell (no NUL: they pass through
    printf)."""
    token = secrets.token_hex(8)
    return f"__SANDBANK_BEGIN_{token}__".encode(), f"__SANDBANK_END_{token}__".encode()


def flush_python_streams() -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: S110 - user code may have broken its own streams
        pass


class FdStream(threading.Thread):
    """Fd 1 or 2 of the worker: a pipe this thread drains for as long as it has a writer, so no
    writer ever blocks on it.

    Python's own writes (`sys.stdout`, `sys.stderr`: `PythonWrites`) do not pass through the
    pipe: they join the call's output directly, after taking what the pipe holds, under the
    same lock as the thread's reads, so the two keep their order. Outside a call both are
    dropped.
    """

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        # Above 9: with fd 1 or 2 closed by user code, a new pipe would take its number.
        r, w = (above_stdio(x) for x in os.pipe())
        os.dup2(w, fd)
        os.close(w)
        os.set_blocking(r, False)
        self.fd, self.r = fd, r
        self.lock = threading.Lock()
        self.kept = Kept()
        self.collecting = False
        self.ended = False
        self.start()

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.r, select.POLLIN)
        while True:
            poller.poll()
            with self.lock:
                if not self.drain():
                    return

    def drain(self) -> bool:
        """Take what the pipe holds (under the lock): kept in a call, dropped outside one.
        False once every writer is gone (user code closed the fd, and no child holds it)."""
        while not self.ended:
            try:
                chunk = os.read(self.r, 65536)
            except BlockingIOError:
                return True
            except OSError:
                chunk = b""
            if not chunk:
                self.ended = True
                os.close(self.r)
                break
            if self.collecting:
                self.kept.keep(chunk)
        return False

    def wrote(self, data: bytes) -> None:
        """Python's own write, in order after what other writers put in the pipe before it."""
        if _forked:  # a fork of user code: no thread drains here, the parent's reads the pipe
            _write_all(self.fd, data)
            return
        with self.lock:
            if self.collecting:
                self.drain()
                self.kept.keep(data)


class PythonWrites(io.RawIOBase):
    """The raw layer under the worker's `sys.stdout` or `sys.stderr`: into the call's output
    of its fd's stream (the stream of the moment: a pipe renewed keeps the Python stream, which
    a logging handler, say, may hold). Its fileno is the fd, so a child given `sys.stdout`
    writes into the pipe."""

    def __init__(self, stream: FdStream) -> None:
        self.stream = stream
        self.name = ("<stdout>", "<stderr>")[stream.fd - 1]
        self.mode = "wb"

    @classmethod
    def over(cls, stream: FdStream, like: object) -> io.TextIOWrapper:
        """The Python text stream over `stream`, with the encoding and errors of `like`."""
        return io.TextIOWrapper(
            io.BufferedWriter(cls(stream)),
            encoding=getattr(like, "encoding", None) or "utf-8",
            errors=getattr(like, "errors", None) or "strict",
        )

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.stream.fd

    def write(self, b: ReadableBuffer, /) -> int:
        data = bytes(b)
        self.stream.wrote(data)
        return len(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as e:
            if e.errno == errno.EINTR:
                continue
            return
        view = view[n:]


_forked = False


def _after_fork_in_child() -> None:
    """In a fork of user code, Python's writes go into the pipes, which the parent drains (the
    fork template's forks, made before any stream, are the worker itself)."""
    global _forked
    if Capture.streams:
        _forked = True
        for s in Capture.streams:  # a lock a drain held at the fork would stay held here
            s.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Capture:
    """Delimits one Python call's output on the worker's fds 1 and 2 and its Python streams.

    Its begin and end each take what the pipes hold with one poll, which also tells whether
    `watch` (another descriptor, the workspace's inotify) has anything to read then:
    `watch_ready`, at the begin and at the end (True where it was not polled).
    """

    streams: list[FdStream] = []
    python: list[io.TextIOWrapper] = []  # sys.stdout and sys.stderr as the worker set them

    def __init__(
        self,
        limit: int,
        live: tuple[Callable[[str], None], Callable[[str], None]] | None = None,
        watch: int = -1,
    ) -> None:
        self.limit = limit
        self.live = live
        self.watch = watch
        self.watch_ready = [True, True]
        self.out = self.err = ""
        if not Capture.streams:
            Capture._renew(0)
            Capture._renew(1)

    @classmethod
    def _renew(cls, i: int) -> None:
        """A fresh stream onto fd 1 (i = 0) or 2; the first time, the Python stream over it
        becomes `sys.stdout` (or `sys.stderr`), and later ones write into the fresh one."""
        stream = FdStream(i + 1)
        if i < len(cls.streams):
            cls.streams[i] = stream
            raw = cls.python[i].buffer.raw  # type: ignore[attr-defined]
            assert isinstance(raw, PythonWrites)
            raw.stream = stream
        else:
            name = ("stdout", "stderr")[i]
            cls.streams.append(stream)
            cls.python.append(PythonWrites.over(stream, getattr(sys, name)))
            setattr(sys, name, cls.python[i])

    def _take(self, at: int) -> None:
        """What the pipes hold now (their locks held): one poll, a read where there is any."""
        poller = select.poll()
        for fd in (*(s.r for s in self.streams), self.watch):
            if fd >= 0:
                poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(0)}
        for s in self.streams:
            if s.r in ready:
                s.drain()
        if self.watch >= 0:
            self.watch_ready[at] = self.watch in ready

    def __enter__(self) -> Capture:
        # Text a background thread printed since the last call is dropped, not this call's.
        flush_python_streams()
        out, err = self.streams
        with out.lock, err.lock:
            self._take(0)
            for i, s in enumerate((out, err)):
                s.kept.begin(self.limit, self.live[i] if self.live else None)
                s.collecting = True
        return self

    def __exit__(self, *exc: object) -> None:
        flush_python_streams()
        out, err = self.streams
        with out.lock, err.lock:
            self._take(1)
            for s in (out, err):
                s.collecting = False
            self.out, self.err = out.kept.text(), err.kept.text()
        for i, s in enumerate((out, err)):
            if s.ended:
                # User code closed or replaced fd 1 or 2 (the pipe's only writer, unless a child
                # it left running holds it too): the next call gets a fresh pipe on the fd.
                Capture._renew(i)
